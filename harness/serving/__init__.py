"""The embedded vLLM CPU server's lifecycle: `tiny_model` (the checkpoint it serves), `launcher` (start, ready on a
real generation, end the whole tree), `placement` (which cores its processes and the client get), `watchdog`
(ends a server whose owner died), `shared_server` (one server per test session, shared by pytest workers),
`health` (which of a session's servers died, and their logs).

May import: `machine`, `errors`, `paths`, `patches`. Never `bench` or `gates`: they build on it.
"""
