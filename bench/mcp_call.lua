-- wrk script: POST one MCP tools/call (protocol 2026-07-28) per request, for bench/run.py.
--
--   wrk -t2 -c16 -d8s -s bench/mcp_call.lua http://127.0.0.1:PORT/mcp -- TOOL KEYFILE [THREADS [ARGSFILE [LIMIT]]]
--
-- TOOL is the tool to call (post_message or echo); its arguments are
-- {"project": "website-v2", "body": "..."}, or the JSON in ARGSFILE (bench/scale.py), where each
-- "{n}" becomes a number no other request of the run has. With LIMIT, each wrk thread stops
-- after that many answers. KEYFILE holds one bearer key a line: wrk
-- thread i takes keys i, i+n, i+2n, ... (n threads) and its requests go round those keys,
-- so 2 threads and 16 keys put 16 different agents on the wire. done() prints one line,
-- "BENCH_JSON {...}", with the counts bench/run.py reads (200s, other statuses, tool errors).

local threads = {}

function setup(thread)
   thread:set("thread_index", #threads)
   table.insert(threads, thread)
end

local function read_keys(path)
   local keys = {}
   for line in io.lines(path) do
      if #line > 0 then table.insert(keys, line) end
   end
   return keys
end

function init(args)
   local tool, keyfile = args[1], args[2]
   local nthreads = tonumber(args[3]) or 1
   local arguments = '{"project":"website-v2","body":"benchmark message, no mention"}'
   if args[4] and #args[4] > 0 then
      local f = assert(io.open(args[4]))
      arguments = f:read("*a"):gsub("%s+$", "")
      f:close()
   end
   limit_ = tonumber(args[5])
   local body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"' .. tool .. '",' ..
      '"arguments":' .. arguments .. ',' ..
      '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",' ..
      '"io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"},' ..
      '"io.modelcontextprotocol/clientCapabilities":{}}}}'
   local all = read_keys(keyfile)
   if #all == 0 then error("no key in " .. keyfile) end
   local mine = {}
   for i, key in ipairs(all) do
      if (i - 1) % nthreads == thread_index % nthreads then table.insert(mine, key) end
   end
   if #mine == 0 then mine = {all[(thread_index % #all) + 1]} end  -- fewer keys than threads
   requests_, headers_, body_ = {}, {}, body
   numbered_ = string.find(body, "{n}", 1, true) ~= nil
   for _, key in ipairs(mine) do
      local headers = {
         ["Accept"] = "application/json, text/event-stream",
         ["Content-Type"] = "application/json",
         ["MCP-Protocol-Version"] = "2026-07-28",
         ["Mcp-Method"] = "tools/call",
         ["Mcp-Name"] = tool,
         ["Authorization"] = "Bearer " .. key,
      }
      table.insert(headers_, headers)
      table.insert(requests_, wrk.format("POST", "/mcp", headers, body))
   end
   sent_, ok_, bad_status_, tool_errors_, answered_ = 0, 0, 0, 0, 0
end

function request()
   sent_ = sent_ + 1
   local i = (sent_ % #requests_) + 1
   if numbered_ then
      local n = tostring(thread_index * 100000000 + sent_)
      return wrk.format("POST", "/mcp", headers_[i], (body_:gsub("{n}", n)))
   end
   return requests_[i]
end

function response(status, headers, body)
   answered_ = answered_ + 1
   if limit_ and answered_ >= limit_ then
      wrk.thread:stop()
   end
   if status ~= 200 then
      bad_status_ = bad_status_ + 1
   elseif string.find(body, '"isError":true', 1, true) then
      tool_errors_ = tool_errors_ + 1
   else
      ok_ = ok_ + 1
   end
end

function done(summary, latency, requests)
   local ok, bad, tool_errors = 0, 0, 0
   for _, t in ipairs(threads) do
      ok = ok + t:get("ok_")
      bad = bad + t:get("bad_status_")
      tool_errors = tool_errors + t:get("tool_errors_")
   end
   local e = summary.errors
   io.write(string.format(
      'BENCH_JSON {"requests":%d,"duration_us":%d,"ok":%d,"bad_status":%d,"tool_errors":%d,' ..
      '"socket_errors":%d,"timeouts":%d,"non2xx":%d,"latency_p50_us":%d,"latency_p99_us":%d}\n',
      summary.requests, summary.duration, ok, bad, tool_errors,
      e.connect + e.read + e.write, e.timeout, e.status,
      latency:percentile(50), latency:percentile(99)))
end
