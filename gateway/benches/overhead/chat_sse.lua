-- wrk script: a small streamed chat completion (short SSE answer).
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"model":"mock-model","messages":[{"role":"user","content":"Say hello in eight words."}],"max_tokens":8,"stream":true}'
