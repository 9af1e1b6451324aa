"""The small programs each client of the matrix runs: fetch the URL given as the first
argument, print the body (status 2xx: exit 0) or the error (exit 1).

Python ones run under the agent virtualenv's interpreter; Node ones under /usr/bin/node; Go
and Java are compiled by the tests (``go build``, ``javac``) before they run in the sandbox.
"""

from __future__ import annotations

_PY_TAIL = """
import sys
try:
    status, body = get(sys.argv[1])
except Exception as e:  # the client's error and its causes, as a traceback would show them
    chain = []
    while e is not None and len(chain) < 6:
        chain.append(f"{type(e).__name__}: {e}")
        e = e.__cause__ or e.__context__
    print("error:", " <- ".join(chain))
    sys.exit(1)
print(status, body)
sys.exit(0 if 200 <= status < 300 else 1)
"""

PYTHON = {
    "urllib": """
import urllib.error, urllib.request
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
""",
    "requests": """
import requests
def get(url):
    r = requests.get(url, timeout=10)
    return r.status_code, r.text
""",
    "httpx": """
import httpx
def get(url):
    r = httpx.get(url, timeout=10)
    return r.status_code, r.text
""",
    "httpx-async": """
import asyncio, httpx
def get(url):
    async def main():
        async with httpx.AsyncClient(timeout=10) as c:
            r = await c.get(url)
            return r.status_code, r.text
    return asyncio.run(main())
""",
    "aiohttp": """
import asyncio, aiohttp
def get(url):
    async def main():
        async with aiohttp.ClientSession() as s:   # no trust_env: the shim makes it the default
            async with s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
                return r.status, await r.text()
    return asyncio.run(main())
""",
}
PYTHON = {k: v + _PY_TAIL for k, v in PYTHON.items()}

NODE = {
    "fetch": """
fetch(process.argv[2]).then(async (r) => {
  console.log(r.status, await r.text());
  process.exit(r.ok ? 0 : 1);
}, (e) => {
  console.log(`error: ${e.message}: ${e.cause ? e.cause.message : ''}`);
  process.exit(1);
});
""",
    "https.get": """
const https = require('node:https');
https.get(process.argv[2], (r) => {
  let body = '';
  r.on('data', (d) => { body += d; });
  r.on('end', () => { console.log(r.statusCode, body); process.exit(r.statusCode < 300 ? 0 : 1); });
}).on('error', (e) => { console.log(`error: ${e.message}`); process.exit(1); });
""",
}

GO = """package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

func main() {
	c := &http.Client{Timeout: 10 * time.Second} // the default transport: ProxyFromEnvironment
	r, err := c.Get(os.Args[1])
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	fmt.Println(r.StatusCode, string(b))
	if r.StatusCode >= 300 {
		os.Exit(1)
	}
}
"""

JAVA = """import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class Get {
    public static void main(String[] args) {
        // The default proxy selector reads -Dhttps.proxyHost/Port (JAVA_TOOL_OPTIONS).
        HttpClient c = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();
        try {
            HttpResponse<String> r = c.send(HttpRequest.newBuilder(URI.create(args[0])).build(),
                                            HttpResponse.BodyHandlers.ofString());
            System.out.println(r.statusCode() + " " + r.body());
            System.exit(r.statusCode() < 300 ? 0 : 1);
        } catch (Exception e) {
            System.out.println("error: " + e);
            System.exit(1);
        }
    }
}
"""
