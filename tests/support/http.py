"""One HTTP GET over a real socket, for the tests of the metrics endpoints."""

import urllib.error
import urllib.request


def get(url: str) -> tuple[int, str, str | None]:
    """``(status, body, Content-Type)`` of ``url``; an HTTP error status is returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode(), resp.headers.get("Content-Type")
    except urllib.error.HTTPError as err:
        body = err.read().decode()
        err.close()
        return err.code, body, err.headers.get("Content-Type")
