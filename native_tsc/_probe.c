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
 * Wire format (32 bytes, little-endian), identical for request and reply:
 *   u32 magic 'CPRB' | u8 version | u8 type (1 request, 2 reply) | u16 0
 *   u32 seq | u32 0 | u64 probe_id | i64 stamp (0 in requests, c_j in replies)
 * Anything else (size, magic, version, type, probe id, sequence, sender
 * address) is ignored and counted. IPv4 only.
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
#define PKT_MAGIC 0x42525043u /* "CPRB" little-endian */
#define PKT_VERSION 1
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

/*
 * respond(fd, stop_fd, timeout_ms, max_packets, virtual_on, skew_e12, offset[, spin_us])
 *   -> (served, ignored, reason)
 * reason: 0 stop_fd readable, 1 idle timeout, 2 max_packets reached.
 * spin_us > 0: after each answered probe, busy-poll the socket for that long before blocking again, so
 * the rest of a burst of probes does not pay the scheduler's wake-up (the core is busy only meanwhile).
 */
static PyObject *probe_respond(PyObject *self, PyObject *args) {
    int fd, stop_fd, timeout_ms, on, spin_us = 0;
    long long max_packets, skew_e12, offset;
    if (!PyArg_ParseTuple(args, "iiiLpLL|i", &fd, &stop_fd, &timeout_ms, &max_packets, &on, &skew_e12,
                          &offset, &spin_us)) {
        return NULL;
    }
    if (spin_us < 0 || spin_us > 1000000) {
        PyErr_SetString(PyExc_ValueError, "spin_us must be 0..1000000");
        return NULL;
    }
    long long served = 0, ignored = 0;
    int reason = -1, err = 0;
    Py_BEGIN_ALLOW_THREADS
    struct pollfd pfd[2];
    pfd[0].fd = fd;
    pfd[0].events = POLLIN;
    pfd[1].fd = stop_fd;
    pfd[1].events = POLLIN;
    int nfds = stop_fd >= 0 ? 2 : 1;
    unsigned char buf[PKT_SIZE + 1];
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
        socklen_t slen = sizeof(src);
        ssize_t n = recvfrom(fd, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&src, &slen);
        uint64_t c_j = cp_raw_read();
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNREFUSED) {
                continue;
            }
            err = errno;
            break;
        }
        packet_t p;
        if (n != PKT_SIZE) {
            ignored++;
            continue;
        }
        memcpy(&p, buf, PKT_SIZE);
        if (p.magic != PKT_MAGIC || p.version != PKT_VERSION || p.type != TYPE_REQUEST) {
            ignored++;
            continue;
        }
        p.type = TYPE_REPLY;
        p.stamp = cp_transform(c_j, on, skew_e12, offset);
        /* A failed reply is a lost probe for the initiator; keep serving. */
        sendto(fd, &p, PKT_SIZE, 0, (struct sockaddr *)&src, slen);
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
    return Py_BuildValue("(LLi)", served, ignored, reason);
}

/*
 * initiate(fd, host, port, count, probe_id, timeout_ms, gap_us, spin)
 *   -> (rows: bytes of count_ok x 5 int64 [seq, c_i raw, c_j, c_k raw, ns_i], lost, ignored)
 */
static PyObject *probe_initiate(PyObject *self, PyObject *args) {
    int fd, port, timeout_ms, gap_us, spin;
    const char *host;
    long long count;
    unsigned long long probe_id;
    if (!PyArg_ParseTuple(args, "isiLKiip", &fd, &host, &port, &count, &probe_id, &timeout_ms, &gap_us,
                          &spin)) {
        return NULL;
    }
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
    unsigned char buf[PKT_SIZE + 1];
    struct pollfd pfd = {fd, POLLIN, 0};
    /* Drain replies left over from an earlier call (bounded, in case of a flood); they are stale anyway. */
    for (int d = 0; d < 4096 && recv(fd, buf, sizeof(buf), MSG_DONTWAIT) >= 0; d++) {
    }
    for (long long s = 0; s < count && !err; s++) {
        packet_t req;
        memset(&req, 0, sizeof(req));
        req.magic = PKT_MAGIC;
        req.version = PKT_VERSION;
        req.type = TYPE_REQUEST;
        req.seq = (uint32_t)s;
        req.probe_id = probe_id;
        int64_t ns_i = mono_raw_ns();
        uint64_t c_i = cp_raw_read();
        if (sendto(fd, &req, PKT_SIZE, 0, (struct sockaddr *)&dst, sizeof(dst)) != PKT_SIZE) {
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
            socklen_t slen = sizeof(src);
            ssize_t n = recvfrom(fd, buf, sizeof(buf), MSG_DONTWAIT, (struct sockaddr *)&src, &slen);
            uint64_t c_k = cp_raw_read();
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNREFUSED) {
                    continue;
                }
                err = errno;
                break;
            }
            packet_t rep;
            if (n != PKT_SIZE || src.sin_family != AF_INET || src.sin_port != dst.sin_port ||
                src.sin_addr.s_addr != dst.sin_addr.s_addr) {
                ignored++;
                continue;
            }
            memcpy(&rep, buf, PKT_SIZE);
            if (rep.magic != PKT_MAGIC || rep.version != PKT_VERSION || rep.type != TYPE_REPLY ||
                rep.probe_id != probe_id || rep.seq != (uint32_t)s) {
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
     "respond(fd, stop_fd, timeout_ms, max_packets, virtual_on, skew_e12, offset[, spin_us]) -> (served, "
     "ignored, reason): answer probes until stop_fd is readable (reason 0), idle timeout (1) or max_packets "
     "(2); spin_us busy-polls that long after each answer."},
    {"initiate", probe_initiate, METH_VARARGS,
     "initiate(fd, host, port, count, probe_id, timeout_ms, gap_us, spin) -> (rows, lost, ignored): "
     "rows is bytes of int64 [seq, c_i raw, c_j, c_k raw, ns_i] per answered probe."},
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
    return m;
}
