-- `wrk` driving POST /v1/search with a bearer token (TOKEN in the environment), one query after
-- another from a few SciFact-like questions; prints the throughput and p50/p90/p99 at the end.
--   TOKEN=$(ragwarden token --sub user:reader --tenant scifact) wrk -t1 -c64 -d10s -s bench/wrk_search.lua http://127.0.0.1:8000
local queries = {"vitamin D and bone density", "aspirin reduces the risk of heart attack",
  "gene expression in cancer cells", "antibiotic resistance in bacteria", "sleep deprivation effects on memory",
  "obesity and type 2 diabetes", "stem cell therapy for heart disease", "smoking and lung cancer risk"}
local token = os.getenv("TOKEN")
local n = 0

request = function()
  n = n + 1
  local body = '{"query": "' .. queries[(n % #queries) + 1] .. '", "k": 10}'
  return wrk.format("POST", "/v1/search", {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}, body)
end

done = function(summary, latency, requests)
  local failed = summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout
  io.write(string.format("%d searches, %.1f/s, %d failed, %d not 2xx, p50 %.1f p90 %.1f p99 %.1f ms\n",
    summary.requests, summary.requests / (summary.duration / 1e6), failed, summary.errors.status,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000))
end
