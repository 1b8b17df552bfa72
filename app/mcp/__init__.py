"""The Model Context Protocol server: memchat's memory as tools for an agent.

`tools` calls the same use cases and repositories as the REST routes, `server` names and
documents them as MCP tools, `http` mounts the streamable-HTTP transport in the app at
`/mcp`, `stdio` serves one client on standard input and output (`memchat mcp`).
"""
