"""The Textual application: one App, built by one factory shared by the CLI and the tests."""

import sys

# asyncio imports ssl for TLS connections, and with it OpenSSL (about 4 MiB of the dashboard's
# RSS); the dashboard's event loop never opens one. asyncio is imported here without it; ssl
# stays importable for whatever needs it later (httpx for Prometheus, in its own calls).
if "asyncio" not in sys.modules and "ssl" not in sys.modules:
    sys.modules["ssl"] = None  # type: ignore[assignment]  # asyncio's own "no ssl here" path
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
