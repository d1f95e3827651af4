"""A small real MCP server (fastmcp) for tests/test_mcp.py: `python _mcp_server.py [--http PORT] [--state DIR]`.

Over stdio by default, over streamable HTTP on localhost with `--http`. `--state` is a folder the server reads
and writes so a test can change it between starts: `crash-next` makes the next `reserve` call kill the server
while the call is in flight (once), and `variant` changes `stock` as a new server version would: `v2` renames
it to `stock_level`, `v3` keeps its name but returns text.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from fastmcp import FastMCP
from fastmcp.utilities.types import Image
from mcp.types import TextContent
from pydantic import BaseModel

STOCK = {"a": 7, "b": 14, "c": 21}
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452")
"""The first 16 bytes of a PNG file: what `photo` sends as image content."""


class Item(BaseModel):
    sku: str
    qty: int


def build(state: Path | None) -> FastMCP:
    mcp = FastMCP("inventory")
    variant = (state / "variant").read_text().strip() if state and (state / "variant").exists() else "v1"

    def stock(sku: str) -> int:
        """Units in stock of `sku`."""
        return STOCK.get(sku, 0)

    def stock_text(sku: str) -> str:
        """Units in stock of `sku`, as text."""
        return str(STOCK.get(sku, 0))

    if variant == "v3":
        mcp.tool(stock_text, name="stock")
    else:
        mcp.tool(stock, name="stock" if variant == "v1" else "stock_level")

    @mcp.tool
    def item(sku: str) -> Item:
        """The item `sku` with its quantity."""
        return Item(sku=sku, qty=STOCK.get(sku, 0))

    @mcp.tool
    def skus() -> list[str]:
        """Every sku."""
        return sorted(STOCK)

    @mcp.tool
    def photo(sku: str) -> Image:
        """A photo of `sku` (image content)."""
        return Image(data=PNG, format="png")

    @mcp.tool(output_schema=None)
    def label(sku: str) -> list[TextContent]:
        """The label of `sku`, as two text contents and no output schema."""
        return [TextContent(type="text", text=f"SKU {sku}"), TextContent(type="text", text=f"qty {STOCK[sku]}")]

    @mcp.tool
    def server_pid() -> int:
        """The process id of this server (a test tells a restarted server by it)."""
        return os.getpid()

    @mcp.tool
    def reserve(sku: str) -> str:
        """Reserve one unit of `sku`."""
        if state is not None and (state / "crash-next").exists():
            (state / "crash-next").unlink()
            os._exit(1)  # the server dies with this call in flight
        if sku not in STOCK:
            raise ValueError(f"unknown sku {sku!r}")
        return f"reserved {sku}"

    return mcp


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--state", type=Path, default=None)
    options = parser.parse_args()
    server = build(options.state)
    if options.http is None:
        server.run(show_banner=False)
    else:
        server.run(transport="http", host="127.0.0.1", port=options.http, show_banner=False, log_level="warning")
