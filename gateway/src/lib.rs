//! prefixgate's gateway: the serving path from an OpenAI request to a vLLM replica.
