"""Dense retrieval for the RAG example: an offline MiniLM encoder, a vector index, an auto-batching server."""
