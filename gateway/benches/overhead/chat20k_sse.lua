-- wrk script: chat20k.lua's request streamed (8 tokens as SSE events, then [DONE]).
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
local prompt = string.rep("The quick brown fox jumps over the lazy dog. ", 455)
wrk.body = '{"model":"mock-model","messages":[{"role":"user","content":"' .. prompt ..
    '"}],"max_tokens":8,"stream":true}'
