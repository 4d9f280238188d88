"""Framework retrievers over ragwarden: LangChain (``integrations.langchain``, extra ``[langchain]``)
and LlamaIndex (``integrations.llamaindex``, extra ``[llamaindex]``).

Each is imported on its own, so neither framework is needed to use the other or ragwarden itself.
"""
