-- wrk script: one of the chat cases (CASE: chat20k or chat20k_sse, from the environment),
-- stopping its thread after REQUESTS answers, so that a profiled run is bounded in count
-- (wrk's -d bounds it in time). profile.sh runs it with one thread and one connection.
dofile(os.getenv("CASE_LUA"))
local limit = tonumber(os.getenv("REQUESTS") or "200")
local answered = 0
function response(status)
    answered = answered + 1
    if answered >= limit then wrk.thread:stop() end
end
