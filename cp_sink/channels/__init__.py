"""Profiling channels for any Python code (the paper's channel API).

::

    from cp_sink.channels import open_channel, read_channel
    ch = open_channel("parser", "buffered", path="parser.cpch")
    ch.log(tuple_id)            # one (TSC, tuple id) pair
    ch.log_batch(ids)           # a numpy array of ids, one TSC reading for the batch
    ch.stats()                  # the ledger: logged = written + buffered + lost
    ch.close()                  # also done at exit and on SIGTERM
    f = read_channel("parser.cpch")

A file the OS refuses to extend (disk full, I/O error) raises ``ChannelWriteError``
(an ``OSError`` naming the channel, the file and the OS error) from the next call.

Handlers (``handler`` argument; parameters as keywords), each with its family's module:

* ``identity`` (alias ``id``): every pair goes to the file raw (a drain thread moves
  the ring into a 64 KiB buffer, flushed when full, by ``stats()`` and at close). Module ``identity``.
* ``buffered``: pairs collect in blocks of ``block`` rows; background threads
  compress full blocks with zstd, one I/O thread writes them in order. Module ``buffered``.

identity's and buffered's ``log`` is one C call into a bounded ring
(``native_tsc.new_ring``); null's and pc's is the ring's counter.
* ``downsample`` (``n``): keeps ids with ``t mod n == 0``, buffered. Module ``buffered``.
* ``xoy`` (``x``, ``y``): keeps ids with ``t mod y < x``, buffered. Module ``buffered``.
* ``pc`` (``periodMs``): counts only; a sampling thread closes each period. Module ``periodic_counter``.
* ``firstlast``: keeps the first and last logged id and the count. Module ``firstlast``.
* ``null``: counts only. Module ``null``.

The other modules: ``handler_spec`` (names and parameters, checked), ``registry``
(handler name -> family), ``opening`` (``open_channel``), ``channel`` (the base
class: file, header, ledger, close sequence), ``frame_file`` (whole writes,
the write error), ``block_writer`` (compression and I/O threads), ``exit_flush``
(closing at exit and on SIGTERM), ``files`` (file formats and the reader),
``config_client`` and ``config_server``.

Several threads may log into one channel (the ring is ordered by the GIL); one
channel per thread keeps each thread's pairs apart. When ``CP_CONFIG_SERVER``
is set, the configuration server chooses the handler of each channel opened
(see ``cp_sink.channels.config_server``).
"""

from __future__ import annotations

from cp_sink.channels.channel import Channel
from cp_sink.channels.config_client import ENV_SERVER
from cp_sink.channels.exit_flush import close_all
from cp_sink.channels.files import ChannelFile, read_channel, read_channel_bytes
from cp_sink.channels.frame_file import ChannelWriteError
from cp_sink.channels.handler_spec import CHANNEL_HANDLERS, DEFAULT_BLOCK, parse_channel_handler
from cp_sink.channels.opening import ENV_DIR, FORMATS, open_channel

__all__ = [
    "CHANNEL_HANDLERS",
    "DEFAULT_BLOCK",
    "ENV_DIR",
    "ENV_SERVER",
    "FORMATS",
    "Channel",
    "ChannelFile",
    "ChannelWriteError",
    "close_all",
    "open_channel",
    "parse_channel_handler",
    "read_channel",
    "read_channel_bytes",
]
