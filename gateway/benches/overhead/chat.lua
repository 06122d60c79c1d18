-- wrk script: a small non-streamed chat completion (the body prefixgate parses and forwards).
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"model":"mock-model","messages":[{"role":"user","content":"Say hello in one word."}],"max_tokens":1}'
