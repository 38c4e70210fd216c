"""A loopback TCP relay between the LM client and a real server, to watch the connection from
outside: who closed it first and how much the server had sent. It can also stall the
server's bytes (a stream that stops arriving) or rename a JSON key in them in place (a chunk
the client cannot use), to reproduce those faults with a real server behind it."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass


@dataclass
class Connection:
    to_server: int = 0  # bytes
    to_client: int = 0
    client_closed_first: bool = False
    closed: bool = False


class TcpRelay:
    def __init__(self, port: int) -> None:
        self.target_port = port
        self.connections: list[Connection] = []
        self.stall_after: int | None = None  # stop passing the server's bytes after this many per connection
        self.rewrite: tuple[bytes, bytes] | None = None  # (old, new), the same length
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        conn = Connection()
        self.connections.append(conn)
        try:
            s_reader, s_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            c_writer.close()
            conn.closed = True
            return

        async def up() -> None:
            while True:
                try:
                    data = await c_reader.read(65536)
                except ConnectionResetError:
                    # a client closing its socket with the server's data still unread in its
                    # buffer resets the connection instead of a clean FIN: it hung up all the same
                    break
                if not data:
                    break
                conn.to_server += len(data)
                s_writer.write(data)
                await s_writer.drain()
            if not conn.closed:
                conn.client_closed_first = True

        async def down() -> None:
            while data := await s_reader.read(65536):
                if self.rewrite is not None:
                    data = data.replace(*self.rewrite)
                if self.stall_after is not None and conn.to_client + len(data) > self.stall_after:
                    data = data[: max(0, self.stall_after - conn.to_client)]
                    conn.to_client += len(data)
                    c_writer.write(data)
                    await asyncio.Event().wait()  # hold the connection open, silent
                conn.to_client += len(data)
                try:
                    c_writer.write(data)
                    await c_writer.drain()
                except ConnectionError:  # the client hung up while the server was still sending
                    if not conn.closed:
                        conn.client_closed_first = True
                    return

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass
        finally:
            conn.closed = True
            for t in tasks:
                t.cancel()
            for w in (c_writer, s_writer):
                w.close()
