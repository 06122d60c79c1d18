-- wrk script: a chat completion with a 20 KB prompt (455 repeats of a 45-byte sentence,
-- 20 475 bytes), 8 tokens, not streamed: the body prefix-aware routers parse and hash.
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
local prompt = string.rep("The quick brown fox jumps over the lazy dog. ", 455)
wrk.body = '{"model":"mock-model","messages":[{"role":"user","content":"' .. prompt ..
    '"}],"max_tokens":8}'
