wrk.path = "http://127.0.0.1:18080/f100"
wrk.headers["Host"] = "127.0.0.1:18080"
done = function(summary, latency, requests)
  io.write(string.format("TAIL %d %d %d %d\n", latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
