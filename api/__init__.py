"""HTTP dialects: OpenAI schemas, converters to and from the engine's neutral types, SSE, errors."""
