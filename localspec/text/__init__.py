"""Text shaping around the model: chat templates, GBNF grammars from JSON Schemas, and checking
JSON against a schema."""
