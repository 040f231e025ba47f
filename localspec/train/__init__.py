"""Training an EAGLE-3 head for a GGUF target (``localspec train-head``, docs/train-head.md).

The steps, each resumable from the cache directory next to the output:

1. ``data`` + ``selfdistill``: the training text, tokenized as the target reads it (chat
   formats through localspec.text.chat_template), optionally extended by the target's own
   continuations generated through the Engine with speculation on;
2. ``collect``: the target's tapped layer inputs and greedy next tokens per position, through
   the core (``_core.FeatureCollector``), in fp16 shards;
3. ``vocab``: the draft vocabulary (the most frequent next tokens) and its d2t map;
4. ``train`` (torch): the head of ``model``, with the training-time unroll;
5. ``write``: the eagle3 GGUF (localspec.heads.eagle3), and ``evaluate``: held-back data through
   the core's drafter.

Only ``model``, ``train`` and ``pipeline`` import torch; nothing else in localspec does.
"""
