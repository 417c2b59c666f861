"""The factory's front end: the one socket generators talk to.

Generators connect a DEALER socket to the front end's ROUTER at the factory
endpoint. The front end answers a sender's hello (so a generator never runs
its schedule into a factory that is not there), records every data bucket it
accepts (sender, sequence number, tuple-id range) and forwards it to the
worker processes, and records and acknowledges each end-of-stream. What it
records, and each sender's hello and latest heartbeat, are kept in the spool
(``cp_source.spool.front_records``: ``_front/ledger.json`` and ``_front/progress.json`` with its
log): a new sender costs one appended line, whatever the number of senders known.

The front end's answers say more than "acknowledged" (``sender_link.AckInfo``):
a hello's answer carries the factory's frame cap (``max_frame_bytes``), so a
generator refuses a bucket too large for it before sending any (and a hello whose workload
fingerprint is not the factory's is refused with the factory's workload, which the generator
names with its own in one line: ``cp_source.wire.workload_id``; a hello that asks for them gets the
factory's workload and schema, against which a generator without one checks its file), and an end of
stream's answer carries the tuples and buckets of that sender it accepted, so
a generator whose connection dropped knows whether its buckets arrived.

Flow control (``cp_source.factory.credit``). A sender whose hello asks for credit may run at most
``max_lead_buckets`` buckets ahead of the frontier the front end sees; its credit rides on the
hello's answer and on acknowledgements of its data (``sender_link.credit_frames``).

Frames over the cap. The socket's ``MAXMSGSIZE`` is well above the cap
(``zmq_bounds.frame_hard_cap``): ZeroMQ answers a frame past ``MAXMSGSIZE``
only by dropping the peer's connection, saying nothing to anyone. A message
with a frame over the cap is received whole, counted (``oversized_frames``),
and forwarded with each frame cut to one byte past the cap: a worker then
dead-letters it as ``oversized`` (the header and the first 64 KiB of the
payload) and, for a valid data header, records its ids as rejected. A worker
never receives more than the cap and a byte per frame.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import zmq

from cp_common.zmq_bounds import cut_frames, recv_bounded
from cp_source.factory.credit import AUTO, DEFAULT_TIMEOUT_S, CreditBook
from cp_source.spool.front_records import MAX_GREETED, FrontLedger, FrontProgress
from cp_source.wire import bucket as bk
from cp_source.wire.sender_link import (
    MAX_ACK_SCHEMA_BYTES,
    REFUSED_SENDER_IN_USE,
    AckInfo,
    answer_control,
    credit_frames,
)
from cp_source.wire.workload_id import WorkloadId, hello_fingerprint, hello_wants_credit, hello_wants_schema
from cp_source.wire.workload_id import refusal as workload_refusal

POLL_MS = 50
MAX_PENDING_HELLOS = 1024  # senders waiting for the workers: bounded, a hello is a few bytes
MAX_FRAMES = bk.MAX_FRAMES  # identity + header + payload + one: cp_source.wire.bucket


class FrontEnd:
    """The front-end thread: ROUTER at the endpoint -> ledger -> PUSH to the workers."""

    def __init__(
        self,
        ctx: zmq.Context,
        front: zmq.Socket,
        back: zmq.Socket,
        spool: str,
        max_frame_bytes: int,
        durability: str = "process",
        workload: WorkloadId | None = None,
        max_lead_buckets: int = AUTO,
        max_spool_bytes: int = 2 << 30,
        sender_timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.front, self.back = front, back
        self.credit = CreditBook(max_lead_buckets, max_spool_bytes, sender_timeout)
        self.workload = workload  # a hello naming another one is refused (cp_source.wire.workload_id)
        self.ledger = FrontLedger(spool, durability)
        self.progress = FrontProgress(self.ledger.dir, self.ledger.durable)
        self.max_frame_bytes = max_frame_bytes
        self.counters = dict.fromkeys(
            (
                "hellos",
                "hellos_refused",
                "hellos_refused_workload",
                "accepted",
                "eos",
                "heartbeats",
                "unexpected",
                "forwarded_unparsed",
                "out_of_window",
                "long_messages",
                "frames_dropped",
                "oversized_frames",
                "senders_unrecorded",
            ),
            0,
        )
        self._held: list[Any] | None = None  # one data message waiting for a worker to have room
        # hellos are answered once every worker is ready: a generator acknowledged earlier would run
        # its schedule into workers still starting, and its queue would fill into counted drops
        self.workers_ready = threading.Event()
        # and whether it asks for credit, and for the factory's schema
        self._pending_hellos: dict[bytes, tuple[bk.Header, bool, bool]] = {}
        self._greeted: dict[int, bytes] = {}  # sender id -> the connection that said hello as it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cp-factory-front", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> FrontEnd:
        self._thread.start()
        return self

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _handle(self, msg: list[Any]) -> None:
        """One message from a generator: answer, record, or hold it for the workers."""
        ident, frames = msg[0], msg[1:]
        try:
            h = bk.check_frames(frames, self.max_frame_bytes)
        except bk.BucketError as e:
            # a data header we can trust: its ids were accepted (unless its seq is out of the window)
            if e.header is not None and self.ledger.in_window(e.header):
                self.ledger.accept(e.header)
            self.counters["forwarded_unparsed"] += 1
            # the workers dead-letter it, counted by reason; a frame over the cap reaches them cut
            # (still over it, so the reason stays), never more than their sockets take
            self._held, cut = cut_frames(frames[:MAX_FRAMES], self.max_frame_bytes + 1)
            self.counters["oversized_frames"] += cut
            return
        if h.kind == bk.KIND_DATA and not self.ledger.in_window(h):
            self.counters["out_of_window"] += 1  # not accepted; a worker dead-letters it by reason
            self._held = frames
        elif h.kind == bk.KIND_DATA:
            self.ledger.accept(h)
            self.credit.data(h)
            self.counters["accepted"] += 1
            self._held = frames
        elif h.kind == bk.KIND_HELLO:
            self.counters["hellos"] += 1
            if self._other_workload(frames[1]):
                self.counters["hellos_refused_workload"] += 1
                assert self.workload is not None
                answer_control(self.front, ident, h, workload_refusal(self.workload))
            elif self._sender_taken(ident, h.sender_id):
                self.counters["hellos_refused"] += 1
                answer_control(self.front, ident, h, REFUSED_SENDER_IN_USE)
            elif self.workers_ready.is_set():
                # on file before the acknowledgement: a reader knows a sender before its first bucket
                if self.progress.hello(h.sender_id):
                    self.progress.maybe_write(force=True)  # one line appended, whatever the senders known
                self.counters["senders_unrecorded"] = self.progress.unrecorded  # counted before the answer
                self._reply(
                    ident, h, credit=hello_wants_credit(frames[1]), schema=hello_wants_schema(frames[1])
                )
            elif ident in self._pending_hellos or len(self._pending_hellos) < MAX_PENDING_HELLOS:
                self.progress.hello(h.sender_id)
                self._pending_hellos[ident] = (
                    h,
                    hello_wants_credit(frames[1]),
                    hello_wants_schema(frames[1]),
                )
            self.counters["senders_unrecorded"] = self.progress.unrecorded
        elif h.kind == bk.KIND_EOS:
            try:
                eos = bk.parse_eos(h, frames[1])
            except bk.BucketError:
                self._held = frames  # a worker dead-letters it as bad_control
                return
            if self.ledger.end_of_stream(h, eos):
                self.credit.ended(h.sender_id)
                self.counters["eos"] += 1
                self._reply(ident, h, self._accepted(eos))
        elif h.kind == bk.KIND_HEARTBEAT:
            self.counters["heartbeats"] += 1  # recorded as progress, never forwarded to the workers
            if self.ledger.in_window(h):  # one forged seq far ahead would pin the sender's progress
                self.progress.heartbeat(h)
                self.credit.heartbeat(h)
            else:
                self.progress.ignored += 1
        else:
            self.counters["unexpected"] += 1  # an acknowledgement sent to us: no tuples, nothing to do

    def _other_workload(self, payload: Any) -> bool:
        """True when a hello names a workload fingerprint that is not this factory's (a hello that
        names none, from an older generator, is taken)."""
        said = hello_fingerprint(payload) if self.workload is not None else None
        return said is not None and self.workload is not None and said != self.workload.fingerprint()

    def _sender_taken(self, ident: bytes, sender_id: int) -> bool:
        """True when another connection said hello as ``sender_id``, or the spool holds its tuples.

        A second run under a sender id would number its tuples with ids already used: its buckets
        would be dead-lettered as replays while the sink's count per sender looked whole.
        """
        if sender_id in self.ledger.senders:
            return True
        greeted = self._greeted.get(sender_id)
        if greeted is not None and greeted != ident:
            return True
        if len(self._greeted) < MAX_GREETED:
            self._greeted[sender_id] = ident
        return False

    def _recv(self) -> list[zmq.Frame]:
        """One message, cut to MAX_FRAMES: the frames past it are read and dropped at once.

        ZeroMQ hands a message over only once its last frame is in, each frame bounded by
        MAXMSGSIZE; cutting here keeps a long message from being held or forwarded, and the
        workers dead-letter the cut message (``frame_count``), so it is counted.
        """
        msg, dropped = recv_bounded(self.front, MAX_FRAMES, copy=False)
        if dropped:
            self.counters["frames_dropped"] += dropped
            self.counters["long_messages"] += 1
        return msg

    def _reply(
        self,
        ident: bytes,
        h: bk.Header,
        info: AckInfo | None = None,
        credit: bool = False,
        schema: bool = False,
    ) -> None:
        """Acknowledge a hello (with the frame cap, the sender's first credit when it asks for one,
        and the factory's workload and schema when it asks for them) or an end of stream (``info``:
        what was accepted)."""
        if h.kind == bk.KIND_HELLO:
            first = self.credit.hello(h.sender_id, ident, credit)
            workload, ddl = self._announced(schema)
            info = AckInfo(self.max_frame_bytes, credit_seq=first, workload=workload, schema=ddl)
        answer_control(self.front, ident, h, info=info)

    def _announced(self, asked: bool) -> tuple[str | None, str | None]:
        """The factory's workload and its schema (Spark DDL, an NDJSON workload's), for a hello that
        asked; a schema too long for the answer is left out (the generator says it was not announced)."""
        w = self.workload
        if not asked or w is None:
            return None, None
        fits = w.ddl and len(w.ddl.encode()) <= MAX_ACK_SCHEMA_BYTES
        return w.name, w.ddl if fits else None

    def _send_credits(self) -> None:
        """The credits that grew, and a keep-alive for each live sender (``cp_source.factory.credit``)."""
        for ident, sender_id, seq_next, credit in self.credit.due():
            # a gone peer, or its queue is full: the next keep-alive says as much or more
            with contextlib.suppress(zmq.ZMQError):
                self.front.send_multipart([ident, *credit_frames(sender_id, seq_next, credit)], zmq.NOBLOCK)

    def _accepted(self, eos: bk.EndOfStream) -> AckInfo:
        """What the front end accepted of a sender: its tuples inside the ids its totals name (so
        buckets forged under its id elsewhere do not count), and its buckets."""
        s = self.ledger.senders.get(eos.sender_id)
        if s is None:
            return AckInfo(accepted_tuples=0, accepted_buckets=0)
        lo, hi = eos.first_tuple_id, eos.next_tuple_id
        tuples = sum(max(0, min(a + c, hi) - max(a, lo)) for a, c in s["ids"])
        return AckInfo(accepted_tuples=tuples, accepted_buckets=int(s["buckets"]))

    def _forward_held(self) -> bool:
        """Pass the held message to a worker if one has room; False when none has."""
        if self._held is None:
            return True
        try:
            self.back.send_multipart(self._held, zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self._held = None
        return True

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # read from generators only while the workers can take more: a full spool then
                # fills the queues back to the generator, whose sends fail as counted drops
                if not self._forward_held():
                    self.back.poll(POLL_MS, zmq.POLLOUT)
                elif self.front.poll(POLL_MS, zmq.POLLIN):
                    for _ in range(256):
                        try:
                            msg = self._recv()
                        except zmq.Again:
                            break
                        self._handle([f.buffer if i else f.bytes for i, f in enumerate(msg)])
                        if not self._forward_held():
                            break
                if self._pending_hellos and self.workers_ready.is_set():
                    self.progress.maybe_write(force=True)  # the senders on file before their acks
                    for ident, (h, credit, schema) in self._pending_hellos.items():
                        self._reply(ident, h, credit=credit, schema=schema)
                    self._pending_hellos.clear()
                self._send_credits()
                self.ledger.maybe_write()
                self.progress.maybe_write()
        except zmq.ContextTerminated:
            pass
        except BaseException as e:  # recorded for the factory's supervisor; never silent
            self.error = e
        finally:
            self.progress.close()
            self.ledger.close()
            for s in (self.front, self.back):
                s.close(0)
