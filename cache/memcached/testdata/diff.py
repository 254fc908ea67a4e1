"""Differential test driver: the same random commands, through pymemcache
(an independent client) and through raw sockets, against real memcached
and against ubkit's memcached server; every answer must be the same.

Run by TestDifferentialPymemcache (differential_test.go), which starts
both servers and puts pymemcache on PYTHONPATH. Each client thread works
in its own key space, so its answers do not depend on how the threads
interleave; a shared key space is used only by commands whose answers
cannot depend on that (reads, add and touch of keys that never change).
CAS tokens are each server's own: they are mapped one to one, not
compared. Exit status 0: all answers agreed; 1: the first difference is
printed with the seed and the commands that led to it.
"""

import argparse
import random
import re
import socket
import sys
import threading
import time
import traceback

from pymemcache.client.base import Client
from pymemcache import exceptions as mcexc

ITEM_SIZE_MAX = 1 << 20
SHARED = [b"shared-%d" % i for i in range(8)]


def value_limit(key, flags):
    """The largest value memcached 1.6 takes with its default -I 1m."""
    return ITEM_SIZE_MAX - 59 - len(key) - (4 if flags else 0)


class FlagsSerde:
    """Keeps the flags with the value, so that they are compared too."""

    def serialize(self, key, value):
        return value, 0

    def deserialize(self, key, value, flags):
        return (flags, value)


class Mismatch(Exception):
    pass


def client(addr):
    host, port = addr.rsplit(":", 1)
    return Client(
        (host, int(port)),
        serde=FlagsSerde(),
        connect_timeout=10,
        timeout=20,
        no_delay=True,
        default_noreply=False,
    )


def outcome(fn):
    """Runs fn and returns its result, or its exception as (type, text)."""
    try:
        return ("ok", fn())
    except (mcexc.MemcacheError, OSError, socket.timeout) as e:
        return ("error", type(e).__name__, str(e))


class CASMap:
    """One to one mapping of memcached's CAS tokens to ours."""

    def __init__(self):
        self.real_to_ours = {}
        self.ours_to_real = {}
        self.latest = {}  # key -> (real, ours) from the last gets

    def pair(self, key, real, ours):
        if real is None and ours is None:
            return True
        if real is None or ours is None:
            return False
        r, o = self.real_to_ours.get(real), self.ours_to_real.get(ours)
        if r is None and o is None:
            self.real_to_ours[real], self.ours_to_real[ours] = ours, real
        elif r != ours or o != real:
            return False
        self.latest[key] = (real, ours)
        return True


class Worker:
    """One client: its own keys, its own random stream, both servers."""

    def __init__(self, args, index, rng):
        self.args = args
        self.index = index
        self.rng = rng
        self.real = client(args.real)
        self.ours = client(args.ours)
        self.raw_real = RawConn(args.real)
        self.raw_ours = RawConn(args.ours)
        self.cas = CASMap()
        self.noreply_sent = False
        self.history = []
        self.key_history = {}
        self.ops = 0
        p = b"c%d-" % index
        self.keys = [p + b"k%d" % i for i in range(16)]
        self.keys += [p + b"c\x01trl", p + b"\x1b[0m", p + b"del\x7f", p + b"hi\x80\xff"]
        self.keys += [(p + b"L" * 250)[:249], (p + b"M" * 250)[:250]]
        self.big = [p + b"big0", (p + b"big1" + b"B" * 250)[:250]]
        self.bigbuf = bytes(rng.getrandbits(8) for _ in range(4096)) * 257

    # Values and parameters.

    def key(self):
        r = self.rng.random()
        if r < 0.05:
            return self.rng.choice(self.big)
        return self.rng.choice(self.keys)

    def value(self, key):
        r = self.rng.random()
        if key in self.big and r < 0.6:
            lim = value_limit(key, 0)
            n = lim + self.rng.randint(-3, 2)
            return self.bigbuf[:n]
        if r < 0.45:
            return bytes(self.rng.getrandbits(8) for _ in range(self.rng.randint(0, 24)))
        if r < 0.75:
            return self.rng.choice(
                [b"0", b"1", b"42", b" 7", b"7 ", b"+5", b"-5", b"-0", b"12abc", b"", b"9223372036854775807",
                 b"18446744073709551616", b"00012", b"\t9\t", b"5 x", b"99999999999999999999"]
            )
        return self.bigbuf[: self.rng.randint(100, 30000)]

    def expire(self):
        return self.rng.choice([0, 0, 0, 0, 3600, 100000, -1, 2592001, int(time.time()) + 86400 * 40])

    def flags(self):
        return self.rng.choice([0, 0, 0, 1, 7, 65535, 4294967295])

    def many(self):
        n = self.rng.choice([1, 2, 5, 20, 100, 150])
        ks = [self.key() for _ in range(n)]
        if self.rng.random() < 0.3:
            ks += self.rng.sample(SHARED, 3)
        return ks

    def set_many_items(self):
        """A set_many's keys and values. pymemcache reads a set_many's
        answers in order and, at the first error (SERVER_ERROR for a value
        too large), raises and closes its connection with the sets after
        that one still on their way: a server runs them when it gets to
        them, which may be after the next command, sent on a new
        connection (memcached and ours both lag so at times). So at most
        one value is too large, and it goes last: every set before it has
        been answered, and none follows it."""
        items = {self.key(): None for _ in range(self.rng.randint(1, 8))}
        items = {k: self.value(k) for k in items}
        over = [k for k, v in items.items() if len(v) > value_limit(k, 0)]
        for k in over[1:]:
            items[k] = items[k][: value_limit(k, 0)]
        if over:
            items[over[0]] = items.pop(over[0])
        return items

    # Comparing.

    def check(self, desc, real, ours):
        real, ours = numbers_unpadded(real), numbers_unpadded(ours)
        if self.args.trace:
            print("client %d op %d: %s -> %s | %s" % (self.index, self.ops, short(desc), short(real), short(ours)),
                  file=sys.stderr)
        self.history.append(desc)
        del self.history[:-12]
        key = desc[1] if len(desc) > 1 and isinstance(desc[1], bytes) else None
        if key is not None:
            h = self.key_history.setdefault(key, [])
            h.append((self.ops, desc, real))
            del h[:-8]
        self.ops += 1
        if real != ours:
            raise Mismatch(
                "client %d op %d: %s\n  memcached: %s\n  ours:      %s\n  first difference: %s\n  last commands: %s"
                "\n  last commands on the key (with memcached's answers): %s"
                % (self.index, self.ops, short(desc), short(real), short(ours), explain(real, ours),
                   [short(h) for h in self.history[:-1]], [short(h) for h in self.key_history.get(key, [])[:-1]])
            )

    def both(self, desc, fn):
        self.check(desc, outcome(lambda: fn(self.real)), outcome(lambda: fn(self.ours)))

    def tame(self, key):
        """Reads key back after incr or decr, and deletes a number of 2^63
        or more: for those, memcached's check for a minus sign reads past
        the value into whatever memory follows, so its next incr answers
        at random (docs/cache.md)."""
        got, ours = outcome(lambda: self.real.get(key)), outcome(lambda: self.ours.get(key))
        self.check(("get after incr/decr", key), got, ours)
        if got[0] != "ok" or got[1] is None or ours[1] is None:
            return
        flags, v = got[1]
        n = v.strip()
        if n.isdigit() and int(n) >= 2 ** 63:
            self.both(("delete a large number", key), lambda c: c.delete(key, noreply=False))
        elif n.isdigit() and (n != v or n != ours[1][1]):
            # The padding of a shorter result is memcached's choice of the
            # moment (see numbers_unpadded): store it bare on both, so
            # that what is appended to it later compares.
            self.both(("store a number bare", key), lambda c: c.set(key, n, noreply=False, flags=flags))

    def sync(self):
        """Waits until both servers ran this client's noreply commands (a
        round trip on the same connection), before gat and gats look on
        another one."""
        for c in (self.real, self.ours):
            outcome(c.version)

    def raw(self, desc, data):
        """A command pymemcache 4 does not have (gat, gats), on raw sockets."""
        self.check(desc, self.raw_real.run(data), self.raw_ours.run(data))

    def close(self):
        for c in (self.real, self.ours):
            c.close()
        for r in (self.raw_real, self.raw_ours):
            r.close()

    def cas_results(self, desc, real, ours):
        """gets answers: values compared, CAS tokens mapped."""
        def split(res):
            if res[0] != "ok":
                return res, {}
            v = res[1]
            if isinstance(v, dict):
                return ("ok", {k: x[0] for k, x in v.items()}), {k: x[1] for k, x in v.items()}
            return ("ok", v[0]), {None: v[1]}
        rv, rc = split(real)
        ov, oc = split(ours)
        self.check(desc, rv, ov)
        for k in set(rc) | set(oc):
            key = k if k is not None else desc[1]
            if not self.cas.pair(key, rc.get(k), oc.get(k)):
                raise Mismatch("client %d op %d: %s: CAS %r (memcached) and %r (ours) do not map one to one"
                               % (self.index, self.ops, desc, rc.get(k), oc.get(k)))

    # Operations.

    def step(self):
        self.do_step()
        if self.noreply_sent:
            self.sync()
            self.noreply_sent = False

    def noreply(self):
        nr = self.rng.random() < 0.3
        self.noreply_sent = self.noreply_sent or nr
        return nr

    def do_step(self):
        rng = self.rng
        op = rng.choices(
            ["get", "get_many", "gets", "gets_many", "set", "set_many", "add", "replace", "append", "prepend",
             "cas", "delete", "delete_many", "incr", "decr", "touch", "gat", "gats", "shared"],
            weights=[10, 5, 6, 3, 14, 3, 5, 4, 4, 3, 6, 5, 2, 5, 4, 3, 3, 2, 4],
        )[0]
        key = self.key()
        if op == "get":
            self.both(("get", key), lambda c: c.get(key))
        elif op == "get_many":
            ks = self.many()
            self.both(("get_many", len(ks)), lambda c: c.get_many(ks))
        elif op == "gets":
            desc = ("gets", key)
            self.cas_results(desc, outcome(lambda: self.real.gets(key)), outcome(lambda: self.ours.gets(key)))
        elif op == "gets_many":
            ks = self.many()
            desc = ("gets_many", tuple(ks))
            self.cas_results(desc, outcome(lambda: self.real.gets_many(ks)), outcome(lambda: self.ours.gets_many(ks)))
        elif op in ("set", "add", "replace", "append", "prepend"):
            v, e, f, nr = self.value(key), self.expire(), self.flags(), self.noreply()
            self.both((op, key, len(v), e, f, nr), lambda c: getattr(c, op)(key, v, expire=e, noreply=nr, flags=f))
            if nr and rng.random() < 0.5:
                self.both(("get after noreply", key), lambda c: c.get(key))
        elif op == "set_many":
            items = self.set_many_items()
            e, nr = self.expire(), self.noreply()
            self.both(("set_many", len(items), e, nr), lambda c: sorted(c.set_many(items, expire=e, noreply=nr)))
            ks = list(items)
            self.both(("get_many after set_many", len(ks)), lambda c: c.get_many(ks))
        elif op == "cas":
            v, e, nr = self.value(key), self.expire(), self.noreply()
            r = rng.random()
            if key in self.cas.latest and r < 0.7:
                rc, oc = self.cas.latest[key]
            elif r < 0.8:
                rc = oc = b"0"
            else:
                rc = oc = str(10 ** 15 + rng.randint(0, 10 ** 6)).encode()
            self.check(("cas", key, len(v), e, nr),
                       outcome(lambda: self.real.cas(key, v, rc, expire=e, noreply=nr)),
                       outcome(lambda: self.ours.cas(key, v, oc, expire=e, noreply=nr)))
        elif op == "delete":
            nr = self.noreply()
            self.both(("delete", key, nr), lambda c: c.delete(key, noreply=nr))
        elif op == "delete_many":
            ks = list({self.key() for _ in range(rng.randint(1, 5))})
            nr = self.noreply()
            self.both(("delete_many", tuple(ks), nr), lambda c: c.delete_many(ks, noreply=nr))
        elif op in ("incr", "decr"):
            d = rng.choice([0, 1, 5, 1000, 2 ** 63, 2 ** 64 - 1])
            before = outcome(lambda: self.real.get(key))
            self.check(("get before " + op, key), before, outcome(lambda: self.ours.get(key)))
            if before[0] == "ok" and before[1] is not None and before[1][1] and not before[1][1].strip():
                # Only white space: memcached's strtoull reads on past the
                # value into whatever memory follows (docs/cache.md).
                return
            nr = self.noreply()
            self.both((op, key, d, nr), lambda c: getattr(c, op)(key, d, noreply=nr))
            self.tame(key)
        elif op == "touch":
            e, nr = self.expire(), self.noreply()
            self.both(("touch", key, e, nr), lambda c: c.touch(key, e, noreply=nr))
        elif op in ("gat", "gats"):
            e = rng.choice([0, 3600, 100000])
            ks = [key] + ([self.key()] if rng.random() < 0.5 else [])
            line = op.encode() + b" %d " % e + b" ".join(ks) + b"\r\n"
            self.raw((op, tuple(ks), e), line)
        elif op == "shared":
            k = rng.choice(SHARED)
            which = rng.choice(["get", "gets", "add", "touch", "gat", "many"])
            if which == "get":
                self.both(("shared get", k), lambda c: c.get(k))
            elif which == "gets":
                self.cas_results(("shared gets", k), outcome(lambda: self.real.gets(k)), outcome(lambda: self.ours.gets(k)))
            elif which == "add":
                self.both(("shared add", k), lambda c: c.add(k, b"other", noreply=False))
            elif which == "touch":
                self.both(("shared touch", k), lambda c: c.touch(k, 0))
            elif which == "gat":
                self.raw(("shared gat", k), b"gat 0 " + k + b"\r\n")
            else:
                ks = SHARED + [self.key() for _ in range(10)]
                self.both(("shared get_many",), lambda c: c.get_many(ks))


CAS_RE = re.compile(rb"(VALUE [^ ]+ \d+ \d+) \d+|( c)\d+(?=[ \r])")
VERSION_RE = re.compile(rb"VERSION 1\.6\.\S+")


def _cas(m):
    if m.group(1):
        return m.group(1) + b" <cas>"
    return m.group(2) + b"<cas>"


def mask_cas(b):
    """CAS tokens of raw answers are each server's own: masked."""
    return VERSION_RE.sub(b"VERSION <v>", CAS_RE.sub(_cas, b))


NUMBER = re.compile(rb"\d+ +")
PADDED_VALUE = re.compile(rb"(VALUE [^ ]+ \d+ )(\d+)((?: <cas>)?\r\n)(\d+ +)(?=\r\n)")


def numbers_unpadded(x):
    """incr and decr pad a shorter result with spaces, unless memcached
    happens to hold another reference to the item just then (its
    refcount test in do_add_delta), when it stores the bare number: a
    number with trailing spaces is compared without them."""
    if isinstance(x, bytes):
        if NUMBER.fullmatch(x):
            return x.rstrip(b" ")
        if b"VALUE" in x:
            return PADDED_VALUE.sub(lambda m: m.group(1) + b"%d" % len(m.group(4).rstrip(b" ")) + m.group(3) + m.group(4).rstrip(b" "), x)
        return x
    if isinstance(x, tuple):
        return tuple(numbers_unpadded(v) for v in x)
    if isinstance(x, list):
        return [numbers_unpadded(v) for v in x]
    if isinstance(x, dict):
        return {k: numbers_unpadded(v) for k, v in x.items()}
    return x


def explain(a, b):
    """Where two answers first differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        only = [k for k in a if k not in b] + [k for k in b if k not in a]
        if only:
            return "keys in one answer only: %s" % short(only)
        for k in a:
            if a[k] != b[k]:
                return "at key %s: %s" % (short(k), explain(a[k], b[k]))
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return "at [%d]: %s" % (i, explain(x, y))
    if isinstance(a, bytes) and isinstance(b, bytes):
        i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return "bytes from offset %d of %d/%d: %r vs %r" % (i, len(a), len(b), a[max(0, i - 40):i + 40], b[max(0, i - 40):i + 40])
    return "%s vs %s" % (short(a), short(b))


def short(x):
    s = repr(x)
    return s if len(s) <= 300 else s[:300] + "...(%d chars)" % len(s)


class RawConn:
    """A raw socket: each case is sent with mn after it, and its answer is
    what comes before the MN line (or the close)."""

    def __init__(self, addr):
        self.addr = addr
        self.sock = None
        self.f = None

    def connect(self):
        host, port = self.addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=20)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.sock.makefile("rb", buffering=1 << 16)

    def run(self, data):
        if self.sock is None:
            self.connect()
        # Sent beside the reading: a long case's answers may fill the
        # socket before the case is all sent.
        sent = threading.Thread(target=self._send, args=(self.sock, data + b"mn\r\n"))
        sent.start()
        want = 1 + (b"\n" + data).count(b"\nmn\r\n")
        out = []
        state = "ok"
        try:
            while want > 0:
                line = self.f.readline()
                if not line:
                    state = "closed"
                    break
                if line == b"MN\r\n":
                    want -= 1
                    if want == 0:
                        break
                out.append(line)
        except (socket.timeout, TimeoutError):
            state = "timeout"
        except OSError:
            state = "closed"
        if state != "ok":
            self.close()
        sent.join()
        return (state, mask_cas(b"".join(out)))

    @staticmethod
    def _send(sock, data):
        try:
            sock.sendall(data)
        except OSError:
            pass

    def close(self):
        if self.sock is not None:
            self.f.close()
            self.sock.close()
        self.sock = self.f = None


class RawWorker:
    """Malformed and odd input, the same bytes to both servers."""

    def __init__(self, args, rng):
        self.rng = rng
        self.real = RawConn(args.real)
        self.ours = RawConn(args.ours)
        self.history = []
        self.ops = 0

    def junk(self, n):
        # Upper case letters only: a data block taken for commands stays
        # ERROR; no N, so that no value is the MN that ends an answer;
        # no digits, so that no value is a number for incr (whose padding
        # memcached chooses at random, see numbers_unpadded).
        return bytes(self.rng.choice(b"ABCDEFGHIJKLMOPQRSTUVWXYZ") for _ in range(n))

    def key(self):
        r = self.rng.random()
        base = b"raw-%d" % self.rng.randint(0, 7)
        if r < 0.15:
            return base + bytes([self.rng.choice([1, 2, 9, 11, 12, 13, 27, 127, 128, 255])]) + b"x"
        if r < 0.2:
            return (base + b"K" * 260)[: self.rng.choice([249, 250, 251, 300])]
        return base

    def number(self):
        return self.rng.choice([b"0", b"1", b"5", b"-1", b"-0", b"+5", b"4294967296", b"4294967295", b"18446744073709551615",
                                b"18446744073709551616", b"5\t", b"0x10", b"1e3", b"abc", b"2147483648", b"-2147483649",
                                b"9223372036854775808", b"007"])

    def exptime(self):
        # Not a few seconds: memcached's clock ticks once a second, so an
        # item of TTL 1 may be gone at once or a second later.
        return self.rng.choice([b"0", b"-1", b"-0", b"+0", b"4294967296", b"4294967295", b"2147483648", b"-2147483649",
                                b"100000", b"abc", b"0x10", b"1e3", b"18446744073709551616", b"9223372036854775808",
                                b"\t0"])

    def case(self):
        rng = self.rng
        kind = rng.randrange(14)
        k = self.key()
        if kind == 0:  # bad length
            n = rng.randint(0, 20)
            d = max(0, n + rng.choice([-3, -1, 1, 3]))
            data = self.junk(n)
            filler = self.junk(d - n) if d > n else b""
            nr = b" noreply" if rng.random() < 0.5 else b""
            return b"set %s 0 0 %d%s\r\n%s\r\n%sget %s\r\n" % (k, d, nr, data, filler, k)
        if kind == 1:  # bad chunk end
            data = self.junk(rng.randint(0, 10))
            nr = b" noreply" if rng.random() < 0.5 else b""
            cmd = rng.choice([b"set", b"add", b"replace", b"append", b"prepend"])
            end = rng.choice([b"XY", b"\r\r", b"\n\n", b"\rX"])
            return b"%s %s 0 0 %d%s\r\n%s%sset %s 0 0 1 noreply\r\nZ\r\nget %s\r\n" % (cmd, k, len(data), nr, data, end, k, k)
        if kind == 2:  # numbers
            fields = [self.number() if rng.random() < 0.4 else b"0", self.exptime() if rng.random() < 0.4 else b"0"]
            data = self.junk(rng.randint(0, 5))
            nr = b" noreply" if rng.random() < 0.3 else b""
            return b"set %s %s %s %d%s\r\n%s\r\ngets %s\r\n" % (k, fields[0], fields[1], len(data), nr, data, k)
        if kind == 3:  # incr and decr (then gone: see Worker.tame)
            v = rng.choice([b"1", b" 2", b"3 ", b"+4", b"-5", b"x", b"", b"18446744073709551616", b"\t6", b"7 abc"])
            cmd = rng.choice([b"incr", b"decr"])
            nr = b" noreply" if rng.random() < 0.3 else b""
            return b"set %s 0 0 %d\r\n%s\r\n%s %s %s%s\r\nget %s\r\ndelete %s\r\n" % (
                k, len(v), v, cmd, k, self.number(), nr, k, k)
        if kind == 4:  # long get lines (of keys with small values only)
            n = rng.choice([10, 200, 1000, 5000, 30000, 200000])
            keys = b" ".join(b"rawg-%d" % rng.randint(0, 9) for _ in range(n))
            if rng.random() < 0.2 and n < 200000:
                # Past 1 MiB a get line is streamed: a bad key there
                # follows the answers already sent (a deliberate
                # difference, docs/cache.md).
                keys += b" " + b"K" * 251
            if rng.random() < 0.1:
                keys += b" rawg-1\x00 rawg-2"
            pre = b"set rawg-%d 0 0 2\r\nAB\r\ndelete rawg-%d\r\n" % (rng.randint(0, 9), rng.randint(0, 9))
            return pre + rng.choice([b"get ", b"gets "]) + keys + b"\r\n"
        if kind == 5:  # long other lines (past 16 KiB: closed)
            n = rng.choice([2047, 2048, 2049, 5000, 16380, 16384, 16385, 20000])
            line = rng.choice([b"bogus ", b"set ", b"gat 0 ", b"touch ", b"delete "])
            return line + self.junk(max(0, n - len(line) - 2)) + b"\r\n"
        if kind == 6:  # too large over an old value
            cmd = rng.choice([b"set", b"add", b"replace", b"append", b"prepend", b"cas"])
            k = b"rawbig-%d" % rng.randint(0, 2)
            n = value_limit(k, 0) + rng.choice([-1, 0, 1, 2])
            extra = b" 1" if cmd == b"cas" else b""
            nr = b" noreply" if rng.random() < 0.3 else b""
            return (b"set %s 0 0 3\r\nOLD\r\n%s %s 0 0 %d%s%s\r\n" % (k, cmd, k, n, extra, nr)) + b"V" * n + b"\r\nget %s\r\n" % k
        if kind == 7:  # control characters and NULs
            c = bytes([rng.choice([0, 1, 9, 11, 13, 27, 127])])
            return b"set raw-c%sx 0 0 1\r\nQ\r\nget raw-c%sx raw-1\r\ndelete raw-c%sx\r\n" % (c, c, c)
        if kind == 8:  # token counts
            n = rng.randint(0, 30)
            cmd = rng.choice([b"get", b"set", b"delete", b"incr", b"touch", b"verbosity", b"flush_all", b"cas", b"gat", b"mg", b"ms", b"bogus"])
            if cmd == b"flush_all":
                return b"flush_all x" + b" y" * n + b"\r\n"  # never a real flush
            return cmd + b"".join(b" " + self.key() for _ in range(n)) + b"\r\n"
        if kind == 9:  # noreply everywhere
            return b"".join(rng.choice([
                b"set %s 0 0 1 noreply\r\nA\r\n" % k, b"add %s 0 0 1 noreply\r\nB\r\n" % k,
                b"append %s 0 0 1 noreply\r\nC\r\n" % k, b"delete %s noreply\r\n" % k,
                b"incr %s 1 noreply\r\n" % k, b"touch %s 10 noreply\r\n" % k, b"verbosity 1 noreply\r\n",
                b"delete %s 5 noreply\r\n" % k, b"set %s 0 0 x noreply\r\n" % k,
            ]) for _ in range(rng.randint(1, 6))) + b"get %s\r\n" % k
        if kind == 10:  # meta
            flags = b" ".join(rng.sample([b"v", b"k", b"s", b"f", b"t", b"q", b"O123", b"c", b"T100", b"F5", b"ME", b"MS",
                                          b"MA", b"MZ", b"N0", b"J3", b"D2", b"MD", b"!", b"C0", b"b"], rng.randint(0, 5)))
            cmd = rng.choice([b"mg", b"md", b"ma", b"ms"])
            if cmd == b"mg":
                # mg's N (a lease: the W, X and Z flags) is not served, and
                # memcached echoes a hit's key base64 or not as the item was
                # stored, which the pool does not keep (docs/cache.md).
                drop = [b"N0", b"k"] if b"b" in flags.split(b" ") else [b"N0"]
                flags = b" ".join(t for t in flags.split(b" ") if t not in drop)
            if cmd == b"ms":
                data = self.junk(rng.randint(0, 4))
                return b"ms %s %d %s\r\n%s\r\nmg %s v f\r\n" % (k, len(data), flags, data, k)
            return b"%s %s %s\r\n" % (cmd, k, flags)
        if kind == 11:  # odd lines
            return rng.choice([b"\r\n", b"\n", b"x\r\n", b"mz\r\n", b"GET / HTTP/1.1\r\n", b"get\r\n", b"gets\r\n",
                               b"gat 10\r\n", b"version\r\n", b"verbosity\r\n", b"verbosity x\r\n", b"stats bogus\r\n",
                               b"  get raw-1\r\n", b"get raw-1\n", b"get raw-1\r\r\n", b"delete\r\n", b"quit\r\n"])
        if kind == 12:  # gat and touch
            e = rng.choice([b"0", b"100", b"-1", b"x", b"4294967296"])
            return b"set %s 0 0 1\r\nG\r\n%s %s %s\r\nget %s\r\n" % (k, rng.choice([b"gat", b"gats", b"touch"]), e, k, k)
        # pipelines of valid commands
        return b"".join(rng.choice([b"set %s 1 0 2\r\nPP\r\n" % k, b"get %s\r\n" % k, b"append %s 0 0 1\r\nQ\r\n" % k,
                                    b"incr %s 1\r\n" % k, b"delete %s\r\n" % k, b"add %s 0 0 1\r\nR\r\n" % k,
                                    b"gets %s raw-1 raw-2\r\n" % k]) for _ in range(rng.randint(2, 12)))

    def step(self):
        data = self.case()
        real, ours = self.real.run(data), self.ours.run(data)
        real, ours = numbers_unpadded(real), numbers_unpadded(ours)
        self.history.append(data)
        del self.history[:-6]
        self.ops += 1
        if real[0] == "timeout" or ours[0] == "timeout" or real != ours:
            raise Mismatch("raw op %d: %s\n  memcached: %s\n  ours:      %s\n  first difference: %s\n  last cases: %s"
                           % (self.ops, short(data), short(real), short(ours), explain(real, ours),
                              [short(h) for h in self.history[:-1]]))

    def close(self):
        self.real.close()
        self.ours.close()


def selftest():
    """Checks the commands the workers make, with no server (they connect
    only when used): run by TestDiffDriver."""
    args = argparse.Namespace(real="127.0.0.1:1", ours="127.0.0.1:1", trace=False)
    for seed in range(100):
        w = Worker(args, seed % 3, random.Random(seed))
        for _ in range(100):
            items = w.set_many_items()
            over = [k for k, v in items.items() if len(v) > value_limit(k, 0)]
            if len(over) > 1 or (over and list(items)[-1] != over[0]):
                print("seed %d: a set_many whose values too large are not one, last: %s"
                      % (seed, short([(k, len(v)) for k, v in items.items()])))
                return 1
    print("self test passed")
    return 0


def main():
    if sys.argv[1:] == ["--selftest"]:
        return selftest()
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--ops", type=int, default=400, help="operations per client")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--raw-ops", type=int, default=150)
    ap.add_argument("--seconds", type=float, default=20, help="stop starting operations after this long")
    ap.add_argument("--trace", action="store_true", help="print every operation to stderr")
    args = ap.parse_args()

    # The shared keys: set once, then only read, added and touched.
    for addr in (args.real, args.ours):
        c = client(addr)
        for i, k in enumerate(SHARED):
            c.set(k, b"shared value %d" % i, flags=i)
        c.close()

    deadline = time.monotonic() + args.seconds
    failures = []
    counts = {}

    def run(name, worker, n):
        try:
            for _ in range(n):
                if failures or time.monotonic() > deadline:
                    break
                worker.step()
        except Mismatch as e:
            failures.append(str(e))
        except Exception:
            failures.append("%s: %s" % (name, traceback.format_exc()))
        finally:
            counts[name] = worker.ops
            worker.close()

    threads = []
    for i in range(args.clients):
        w = Worker(args, i, random.Random(args.seed * 1000 + i))
        threads.append(threading.Thread(target=run, args=("client %d" % i, w, args.ops)))
    raw = RawWorker(args, random.Random(args.seed * 1000 + 999))
    threads.append(threading.Thread(target=run, args=("raw", raw, args.raw_ops)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(counts.values())
    if failures:
        print("seed %d: DIFFERENT ANSWERS after %d operations (%s)" % (args.seed, total, counts))
        for f in failures:
            print(f)
        return 1
    print("seed %d: same answers for %d operations (%s)" % (args.seed, total, counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
