"""The memory plan: what each model needs (weights, KV cache, recurrent state), the devices it can
go to (local and RPC), where the layers go, and the table that shows it."""
