"""Dense retrieval for the RAG example: an offline MiniLM encoder, a vector index, an auto-batching server.

Modules: :mod:`.corpus` (corpus files, document store), :mod:`.encoder` (MiniLM, torch imported lazily),
:mod:`.index` (FAISS / NumPy exact search, build and cache), :mod:`.batching` (request batching),
:mod:`.server` (HTTP) and :mod:`.build_index` (CLI).
"""
