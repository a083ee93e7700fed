"""MCP over Streamable HTTP with an ordinary keep-alive client (Python's http.client), as a
plain script would talk to it: initialize, then five pings on the same connection. Prints the
fastest ping in milliseconds. Usage: python3 keepalive.py HOST:PORT API_KEY"""
import http.client
import json
import sys
import time

host, key = sys.argv[1], sys.argv[2]
conn = http.client.HTTPConnection(host, timeout=30)
headers = {
    "Authorization": f"Bearer {key}",
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
}


def post(message, session=None):
    extra = {"Mcp-Session-Id": session} if session else {}
    conn.request("POST", "/mcp", json.dumps(message), {**headers, **extra})
    response = conn.getresponse()
    body = response.read()
    assert response.status in (200, 202), (response.status, body)
    return response.getheader("Mcp-Session-Id"), body


session, _ = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {},
    "clientInfo": {"name": "keepalive", "version": "1"}}})
post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
fastest = float("inf")
for i in range(5):
    started = time.perf_counter()
    _, body = post({"jsonrpc": "2.0", "id": 10 + i, "method": "ping"}, session)
    fastest = min(fastest, (time.perf_counter() - started) * 1e3)
    assert b'"result"' in body, body
print(f"{fastest:.3f}")
