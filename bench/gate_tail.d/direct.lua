wrk.path = "/f100"
done = function(summary, latency, requests)
  io.write(string.format("TAIL %d %d %d %d\n", latency:percentile(50), latency:percentile(99), latency:percentile(99.9), latency.max))
end
