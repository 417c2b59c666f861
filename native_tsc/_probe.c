/*
 * native_tsc._probe: MinRTT probe loops timed in C.
 *
 * A probe is one UDP round trip: the initiator stamps c_i just before
 * sendto, the responder stamps c_j just after recvfrom and echoes it, the
 * initiator stamps c_k just after the matching reply arrives. Both loops run
 * with the GIL released and no Python between the stamps, so the round trip
 * measures the network and not the interpreter.
 *
 * The initiator returns RAW counter values (the caller applies its own
 * process's virtual transform with native_tsc._tsc.transform). The responder
 * cannot do that on the initiator's side, so it applies the transform it is
 * given (the same exact 128-bit arithmetic as native_tsc._tsc) before
 * replying: c_j travels in the responder's own domain.
 *
 * Wire format (little-endian), identical for request and reply:
 *   u32 magic 'CPRB' | u8 version | u8 type (1 request, 2 reply) | u16 0
 *   u32 seq | u32 0 | u64 probe_id | i64 stamp (0 in requests, c_j in replies)
 * version 1: those 32 bytes. version 2 (keyed): 40 bytes, the 32 above and a
 * u64 SipHash-2-4 tag over them under a 16-byte key shared through the
 * (CurveZMQ) control channel. Anything else (size, magic, version, type, probe
 * id, sequence, sender address, tag) is ignored and counted. IPv4 only.
 *
 * The responder can be given an allow-list of IPv4 sources: a datagram from
 * any other address gets no answer (counted as refused), so the responder
 * cannot be aimed at a third host as a reflector.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "tsc_counter.h"

#define PKT_SIZE 32
#define KEYED_SIZE 40 /* PKT_SIZE + the u64 tag */
#define KEY_SIZE 16
#define PKT_MAGIC 0x42525043u /* "CPRB" little-endian */
#define PKT_VERSION 1
#define PKT_VERSION_KEYED 2
#define MAX_ALLOW 512 /* allowed sources: two per agent (reached at, probes from) of the coordinator's 256 */
#define TYPE_REQUEST 1
#define TYPE_REPLY 2
#define MAX_PROBES 1000000
#define ROW_FIELDS 5 /* seq, c_i (raw), c_j (responder domain), c_k (raw), ns_i */


typedef struct {
    uint32_t magic;
    uint8_t version;
    uint8_t type;
    uint16_t zero0;
    uint32_t seq;
    uint32_t zero1;
    uint64_t probe_id;
    int64_t stamp;
} packet_t;

_Static_assert(sizeof(packet_t) == PKT_SIZE, "packet layout");

/* SipHash-2-4 (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012). */
#define ROTL64(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                             \
    do {                                                                                                     \
        v0 += v1;                                                                                            \
        v1 = ROTL64(v1, 13);                                                                                 \
        v1 ^= v0;                                                                                            \
        v0 = ROTL64(v0, 32);                                                                                 \
        v2 += v3;                                                                                            \
        v3 = ROTL64(v3, 16);                                                                                 \
        v3 ^= v2;                                                                                            \
        v0 += v3;                                                                                            \
        v3 = ROTL64(v3, 21);                                                                                 \
        v3 ^= v0;                                                                                            \
        v2 += v1;                                                                                            \
        v1 = ROTL64(v1, 17);                                                                                 \
        v1 ^= v2;                                                                                            \
        v2 = ROTL64(v2, 32);                                                                                 \
    } while (0)

static uint64_t load_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static uint64_t siphash24(const unsigned char key[KEY_SIZE], const unsigned char *in, size_t len) {
    uint64_t k0 = load_le64(key), k1 = load_le64(key + 8);
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL, v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL, v3 = k1 ^ 0x7465646279746573ULL;
    size_t full = len - len % 8;
    for (size_t i = 0; i < full; i += 8) {
        uint64_t m = load_le64(in + i);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    /* The last block: the leftover bytes, and the length's low byte in the top byte. */
    uint64_t b = (uint64_t)(len & 0xff) << 56;
    for (size_t i = 0; i < len % 8; i++) {
        b |= (uint64_t)in[full + i] << (8 * i);
    }
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* The keyed packet's tag, appended little-endian after the 32 bytes it covers. */
static void put_tag(unsigned char *pkt, const unsigned char key[KEY_SIZE]) {
    uint64_t t = siphash24(key, pkt, PKT_SIZE);
    for (int i = 0; i < 8; i++) {
        pkt[PKT_SIZE + i] = (unsigned char)(t >> (8 * i));
    }
}

/* Constant time, so a forger learns nothing from how fast a wrong tag is dropped. */
static int tag_ok(const unsigned char *pkt, const unsigned char key[KEY_SIZE]) {
    uint64_t want = siphash24(key, pkt, PKT_SIZE), got = load_le64(pkt + PKT_SIZE);
    return (want ^ got) == 0;
}

static int allowed(const uint32_t *allow, Py_ssize_t n_allow, uint32_t addr) {
    for (Py_ssize_t i = 0; i < n_allow; i++) {
        if (allow[i] == addr) {
            return 1;
        }
    }
    return 0;
}

/* An optional key argument: None, or exactly KEY_SIZE bytes (copied to out). -1 with an exception on error. */
static int parse_key(PyObject *obj, unsigned char out[KEY_SIZE], int *keyed) {
    *keyed = 0;
    if (obj == NULL || obj == Py_None) {
        return 0;
    }
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != KEY_SIZE) {
        PyErr_Format(PyExc_ValueError, "probe key must be %d bytes", KEY_SIZE);
        return -1;
    }
    memcpy(out, PyBytes_AS_STRING(obj), KEY_SIZE);
    *keyed = 1;
    return 0;
}

static PyObject *probe_siphash24(PyObject *self, PyObject *args) {
    Py_buffer key, data;
    if (!PyArg_ParseTuple(args, "y*y*", &key, &data)) {
        return NULL;
    }
    PyObject *res = NULL;
    if (key.len != KEY_SIZE) {
        PyErr_Format(PyExc_ValueError, "SipHash key must be %d bytes", KEY_SIZE);
    } else {
        res = PyLong_FromUnsignedLongLong(siphash24(key.buf, data.buf, (size_t)data.len));
    }
    PyBuffer_Release(&key);
    PyBuffer_Release(&data);
    return res;
}

static int64_t mono_raw_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *probe_transform(PyObject *self, PyObject *args) {
    long long raw, skew_e12, offset;
    int on;
    if (!PyArg_ParseTuple(args, "LpLL", &raw, &on, &skew_e12, &offset)) {
        return NULL;
    }
    return PyLong_FromLongLong(cp_transform((uint64_t)raw, on, skew_e12, offset));
}

/* What the responder does with one datagram. */
enum { REQ_ANSWER, REQ_IGNORE, REQ_REFUSE };

/*
 * Checks a received datagram: malformed ones are ignored; a well-formed request from a source not on the
 * allow-list, or without a valid tag when the responder is keyed, is refused.
 */
static int classify(const unsigned char *buf, ssize_t n, const struct sockaddr_in *src, const uint32_t *allow,
                    Py_ssize_t n_allow, const unsigned char *key) {
    if (n_allow >= 0 && (src->sin_family != AF_INET || !allowed(allow, n_allow, src->sin_addr.s_addr))) {
        return REQ_REFUSE;
    }
    packet_t p;
    if (n != PKT_SIZE && n != KEYED_SIZE) {
        return REQ_IGNORE;
    }
    memcpy(&p, buf, PKT_SIZE);
    int version = n == KEYED_SIZE ? PKT_VERSION_KEYED : PKT_VERSION;
    if (p.magic != PKT_MAGIC || p.version != version || p.type != TYPE_REQUEST) {
        return REQ_IGNORE;
    }
    if (key == NULL) {
        return version == PKT_VERSION ? REQ_ANSWER : REQ_IGNORE; /* a keyed probe cannot be checked here */
    }
    return version == PKT_VERSION_KEYED && tag_ok(buf, key) ? REQ_ANSWER : REQ_REFUSE;
}

/*
 * respond(fd, stop_fd, timeout_ms, max_packets, virtual_on, skew_e12, offset[, spin_us[, allow[, key]]])
 *   -> (served, ignored, refused, reason)
 * reason: 0 stop_fd readable, 1 idle timeout, 2 max_packets reached.
 * spin_us > 0: after each answered probe, busy-poll the socket for that long before blocking again, so
 * the rest of a burst of probes does not pay the scheduler's wake-up (the core is busy only meanwhile).
 * allow: None (answer any source) or bytes of up to MAX_ALLOW IPv4 addresses, 4 bytes each in network order.
 * key: None (version 1 probes) or 16 bytes (only version 2 probes with a valid tag are answered, tagged).
 */
#define RECV_AGAIN (-1)  /* nothing there, interrupted, or an ICMP refusal: poll again */
#define RECV_FAILED (-2) /* a socket error, in *err */

/* One datagram without blocking, the raw counter read right after it arrives (both loops stamp
 * here: c_j in the responder, c_k in the initiator). Returns its size, RECV_AGAIN or RECV_FAILED. */
static inline ssize_t recv_stamped(int fd, unsigned char *buf, size_t cap, struct sockaddr_in *src,
                                   uint64_t *stamp, int *err) {
    socklen_t slen = sizeof(*src);
    ssize_t n = recvfrom(fd, buf, cap, MSG_DONTWAIT, (struct sockaddr *)src, &slen);
    *stamp = cp_raw_read();
    if (n >= 0) {
        return n;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNREFUSED) {
        return RECV_AGAIN;
    }
    *err = errno;
    return RECV_FAILED;
}

static PyObject *probe_respond(PyObject *self, PyObject *args) {
    int fd, stop_fd, timeout_ms, on, spin_us = 0;
    long long max_packets, skew_e12, offset;
    PyObject *allow_obj = Py_None, *key_obj = Py_None;
    if (!PyArg_ParseTuple(args, "iiiLpLL|iOO", &fd, &stop_fd, &timeout_ms, &max_packets, &on, &skew_e12,
                          &offset, &spin_us, &allow_obj, &key_obj)) {
        return NULL;
    }
    if (spin_us < 0 || spin_us > 1000000) {
        PyErr_SetString(PyExc_ValueError, "spin_us must be 0..1000000");
        return NULL;
    }
    uint32_t allow[MAX_ALLOW];
    Py_ssize_t n_allow = -1; /* -1: no list, every source is answered */
    if (allow_obj != Py_None) {
        if (!PyBytes_Check(allow_obj) || PyBytes_GET_SIZE(allow_obj) % 4 ||
            PyBytes_GET_SIZE(allow_obj) / 4 > MAX_ALLOW) {
            PyErr_Format(PyExc_ValueError, "allow must be bytes of at most %d IPv4 addresses (4 bytes each)",
                         MAX_ALLOW);
            return NULL;
        }
        n_allow = PyBytes_GET_SIZE(allow_obj) / 4;
        memcpy(allow, PyBytes_AS_STRING(allow_obj), (size_t)n_allow * 4);
    }
    unsigned char key[KEY_SIZE];
    int keyed;
    if (parse_key(key_obj, key, &keyed) < 0) {
        return NULL;
    }
    long long served = 0, ignored = 0, refused = 0;
    int reason = -1, err = 0;
    Py_BEGIN_ALLOW_THREADS
    struct pollfd pfd[2];
    pfd[0].fd = fd;
    pfd[0].events = POLLIN;
    pfd[1].fd = stop_fd;
    pfd[1].events = POLLIN;
    int nfds = stop_fd >= 0 ? 2 : 1;
    unsigned char buf[KEYED_SIZE + 1];
    int64_t spin_until = 0;
    unsigned int spins = 0;
    while (reason < 0) {
        int spinning = spin_us > 0 && mono_raw_ns() < spin_until;
        if (spinning) {
            /* Look at the stop pipe now and then while spinning. */
            if ((++spins & 1023) == 0 && nfds == 2 && poll(pfd + 1, 1, 0) > 0) {
                reason = 0;
                break;
            }
        } else {
            int pr = poll(pfd, nfds, timeout_ms);
            if (pr < 0) {
                if (errno == EINTR) {
                    continue;
                }
                err = errno;
                break;
            }
            if (pr == 0) {
                reason = 1;
                break;
            }
            if (nfds == 2 && (pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) {
                reason = 0;
                break;
            }
            if (!(pfd[0].revents & POLLIN)) {
                continue;
            }
        }
        struct sockaddr_in src;
        uint64_t c_j;
        ssize_t n = recv_stamped(fd, buf, sizeof(buf), &src, &c_j, &err);
        if (n == RECV_AGAIN) {
            continue;
        }
        if (n == RECV_FAILED) {
            break;
        }
        /* The checks and the reply's tag run after c_j is stamped: they only widen the initiator's round
         * trip by a few hundred ns, which the MinRTT bracket [c_i, c_k] already covers. */
        int verdict = classify(buf, n, &src, allow, n_allow, keyed ? key : NULL);
        if (verdict != REQ_ANSWER) {
            if (verdict == REQ_REFUSE) {
                refused++;
            } else {
                ignored++;
            }
            continue;
        }
        packet_t p;
        memcpy(&p, buf, PKT_SIZE);
        p.type = TYPE_REPLY;
        p.stamp = cp_transform(c_j, on, skew_e12, offset);
        memcpy(buf, &p, PKT_SIZE);
        if (keyed) {
            put_tag(buf, key);
        }
        /* A failed reply is a lost probe for the initiator; keep serving. src is an AF_INET address. */
        sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&src, sizeof(src));
        served++;
        if (spin_us > 0) {
            spin_until = mono_raw_ns() + (int64_t)spin_us * 1000;
        }
        if (max_packets > 0 && served >= max_packets) {
            reason = 2;
        }
    }
    Py_END_ALLOW_THREADS
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return Py_BuildValue("(LLLi)", served, ignored, refused, reason);
}

/*
 * initiate(fd, host, port, count, probe_id, timeout_ms, gap_us, spin[, key])
 *   -> (rows: bytes of count_ok x 5 int64 [seq, c_i raw, c_j, c_k raw, ns_i], lost, ignored)
 * key: None (version 1 probes) or 16 bytes (version 2: requests tagged, replies without a valid tag ignored).
 */
static PyObject *probe_initiate(PyObject *self, PyObject *args) {
    int fd, port, timeout_ms, gap_us, spin;
    const char *host;
    long long count;
    unsigned long long probe_id;
    PyObject *key_obj = Py_None;
    if (!PyArg_ParseTuple(args, "isiLKiip|O", &fd, &host, &port, &count, &probe_id, &timeout_ms, &gap_us,
                          &spin, &key_obj)) {
        return NULL;
    }
    unsigned char key[KEY_SIZE];
    int keyed;
    if (parse_key(key_obj, key, &keyed) < 0) {
        return NULL;
    }
    const ssize_t size = keyed ? KEYED_SIZE : PKT_SIZE;
    if (count < 1 || count > MAX_PROBES) {
        PyErr_Format(PyExc_ValueError, "count must be 1..%d", MAX_PROBES);
        return NULL;
    }
    if (port < 1 || port > 65535 || timeout_ms < 1 || gap_us < 0) {
        PyErr_SetString(PyExc_ValueError, "invalid port, timeout or gap");
        return NULL;
    }
    struct sockaddr_in dst;
    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &dst.sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not an IPv4 address: %s", host);
        return NULL;
    }
    int64_t *rows = PyMem_RawMalloc((size_t)count * ROW_FIELDS * sizeof(int64_t));
    if (rows == NULL) {
        return PyErr_NoMemory();
    }
    long long ok = 0, lost = 0, ignored = 0;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    unsigned char buf[KEYED_SIZE + 1], out[KEYED_SIZE];
    struct pollfd pfd = {fd, POLLIN, 0};
    /* Drain replies left over from an earlier call (bounded, in case of a flood); they are stale anyway. */
    for (int d = 0; d < 4096 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) >= 0; d++) {
    }
    for (long long s = 0; s < count && !err; s++) {
        packet_t req;
        memset(&req, 0, sizeof(req));
        req.magic = PKT_MAGIC;
        req.version = keyed ? PKT_VERSION_KEYED : PKT_VERSION;
        req.type = TYPE_REQUEST;
        req.seq = (uint32_t)s;
        req.probe_id = probe_id;
        memcpy(out, &req, PKT_SIZE);
        if (keyed) {
            put_tag(out, key); /* before c_i: the tag costs the round trip nothing on this side */
        }
        int64_t ns_i = mono_raw_ns();
        uint64_t c_i = cp_raw_read();
        if (sendto(fd, out, (size_t)size, 0, (struct sockaddr *)&dst, sizeof(dst)) != size) {
            if (errno == EINTR || errno == ECONNREFUSED || errno == EAGAIN) {
                lost++;
                continue;
            }
            err = errno;
            break;
        }
        int64_t deadline = ns_i + (int64_t)timeout_ms * 1000000LL;
        for (;;) {
            /* Checked on every pass, so a stream of ignored datagrams cannot hold a probe open. */
            if (spin && mono_raw_ns() > deadline) {
                lost++;
                break;
            }
            if (!spin) {
                int64_t left_ms = (deadline - mono_raw_ns() + 999999) / 1000000;
                if (left_ms <= 0) {
                    lost++;
                    break;
                }
                int pr = poll(&pfd, 1, (int)left_ms);
                if (pr < 0 && errno != EINTR) {
                    err = errno;
                    break;
                }
                if (pr <= 0) {
                    continue;
                }
            }
            struct sockaddr_in src;
            uint64_t c_k;
            ssize_t n = recv_stamped(fd, buf, sizeof(buf), &src, &c_k, &err);
            if (n == RECV_AGAIN) {
                continue;
            }
            if (n == RECV_FAILED) {
                break;
            }
            packet_t rep;
            if (n != size || src.sin_family != AF_INET || src.sin_port != dst.sin_port ||
                src.sin_addr.s_addr != dst.sin_addr.s_addr) {
                ignored++;
                continue;
            }
            memcpy(&rep, buf, PKT_SIZE);
            /* c_k is already stamped: checking the tag widens nothing. */
            if (rep.magic != PKT_MAGIC || rep.version != req.version || rep.type != TYPE_REPLY ||
                rep.probe_id != probe_id || rep.seq != (uint32_t)s || (keyed && !tag_ok(buf, key))) {
                ignored++;
                continue;
            }
            int64_t *row = rows + ok * ROW_FIELDS;
            row[0] = s;
            row[1] = (int64_t)c_i;
            row[2] = rep.stamp;
            row[3] = (int64_t)c_k;
            row[4] = ns_i;
            ok++;
            break;
        }
        if (gap_us > 0 && s + 1 < count) {
            struct timespec gap = {gap_us / 1000000, (long)(gap_us % 1000000) * 1000L};
            nanosleep(&gap, NULL);
        }
    }
    Py_END_ALLOW_THREADS
    if (err) {
        PyMem_RawFree(rows);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)rows, (Py_ssize_t)(ok * ROW_FIELDS * sizeof(int64_t)));
    PyMem_RawFree(rows);
    if (data == NULL) {
        return NULL;
    }
    return Py_BuildValue("(NLL)", data, lost, ignored);
}

static PyMethodDef methods[] = {
    {"respond", probe_respond, METH_VARARGS,
     "respond(fd, stop_fd, timeout_ms, max_packets, virtual_on, skew_e12, offset[, spin_us[, allow[, key]]]) "
     "-> (served, ignored, refused, reason): answer probes until stop_fd is readable (reason 0), idle timeout "
     "(1) or max_packets (2); spin_us busy-polls that long after each answer; allow (packed IPv4 sources) "
     "and key (16 bytes) refuse other sources and untagged probes."},
    {"initiate", probe_initiate, METH_VARARGS,
     "initiate(fd, host, port, count, probe_id, timeout_ms, gap_us, spin[, key]) -> (rows, lost, ignored): "
     "rows is bytes of int64 [seq, c_i raw, c_j, c_k raw, ns_i] per answered probe."},
    {"siphash24", probe_siphash24, METH_VARARGS,
     "siphash24(key, data) -> int: SipHash-2-4 of data under a 16-byte key, as keyed probes are tagged."},
    {"transform", probe_transform, METH_VARARGS,
     "transform(raw, virtual_on, skew_e12, offset) -> int: the responder's stamp transform."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_probe", "MinRTT probe loops timed in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__probe(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    cp_detect_rdtscp();
    PyModule_AddIntConstant(m, "PACKET_SIZE", PKT_SIZE);
    PyModule_AddIntConstant(m, "MAX_PROBES", MAX_PROBES);
    PyModule_AddIntConstant(m, "ROW_FIELDS", ROW_FIELDS);
    PyModule_AddIntConstant(m, "KEYED_PACKET_SIZE", KEYED_SIZE);
    PyModule_AddIntConstant(m, "KEY_SIZE", KEY_SIZE);
    PyModule_AddIntConstant(m, "MAX_ALLOW", MAX_ALLOW);
    return m;
}
