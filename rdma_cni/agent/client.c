/*
 * rdma-cni thin client in C: the CNI executable's first step when Python's own start-up (~15-20 ms)
 * would cost more than the whole call in the warm agent. It speaks exactly the protocol documented
 * in rdma_cni/agent/client.py (frames "RCN1" count size, items u32-BE length + bytes; SCM_RIGHTS with
 * the caller's /proc/self/ns/{net,mnt} and its root directory "/", which the worker takes too: a
 * delegate of upstream Multus thick runs chrooted into /hostroot; READY 'R' / REFUSE 'N' / GO 'G';
 * wire version 2: the request offers "RDMA_CNI_WIRE=1-2", and SKEW 'V' + a one-item frame is a
 * refusal for the wire version, whose reason (naming both versions) goes to stderr),
 * and when the agent is
 * absent, refuses, or breaks before GO, it execs the in-process implementation with the same stdin
 * and environment (plus RDMA_CNI_AGENT=off so that one does not try the agent again). After GO it
 * does so for an ADD only when the agent itself died (SO_PEERCRED names it; in a DaemonSet its death
 * takes every worker with it): client.py's docstring says why.
 *
 * Environment: RDMA_CNI_AGENT_SOCKET (default below), RDMA_CNI_AGENT=off (never ask the agent),
 * RDMA_CNI_AGENT_TIMEOUT (seconds to connect and get READY, default 3; as the Python client).
 *
 * Plugin name: basename of argv[0] (rdma-macvlan, rdma-multus).
 * Fallback program: $RDMA_CNI_FALLBACK, else "rdma-cni" beside this executable (the PyInstaller
 * multicall bundle, which dispatches on argv[0], so it is exec'd with the same argv[0]).
 *
 * Readiness probe: rdma-cni-client --probe [--socket PATH] [--probe-wait S] [--probe-timeout S]
 * exits 0 when an agent answers a CNI VERSION call of rdma-macvlan through the whole protocol, as
 * `rdma-agent --probe` does (see probe() below); it never falls back.
 *
 * Build: cc -O2 -static -o rdma-cni-client client.c   (scripts/build-client does this)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/run/rdma-cni/agent.sock"
#define READY_TIMEOUT_MS 3000
#define ANSWER_TIMEOUT_S 600
#define MAX_FRAME (8u * 1024 * 1024)
#define TRY_AGAIN_LATER 11
#define WIRE_OFFER "RDMA_CNI_WIRE=1-2"  /* the wire versions this client speaks (rdma_cni/agent/wire.py) */

extern char **environ;

struct buf { unsigned char *p; size_t len, cap; };

static void put(struct buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) { perror("rdma-cni-client: realloc"); exit(5); }
        b->p = p; b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_u32(struct buf *b, uint32_t v) {
    unsigned char x[4] = { v >> 24, v >> 16, v >> 8, v };
    put(b, x, 4);
}

static uint32_t get_u32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void put_item(struct buf *b, const void *data, size_t n) { put_u32(b, (uint32_t)n); put(b, data, n); }

static int read_all(int fd, struct buf *b) {
    unsigned char chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n == 0) return 0;
        if (n < 0) { if (errno == EINTR) continue; return -1; }
        put(b, chunk, (size_t)n);
        if (b->len > MAX_FRAME) return -1;
    }
}

static int recv_exact(int fd, unsigned char *p, size_t n) {
    while (n) {
        ssize_t r = recv(fd, p, n, 0);
        if (r == 0) { errno = EPIPE; return -1; }  /* the peer is gone: not a timeout */
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        p += r; n -= (size_t)r;
    }
    return 0;
}

static int send_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
        if (r < 0) { if (errno == EINTR) continue; return -1; }
        p += r; n -= (size_t)r;
    }
    return 0;
}

static void set_timeout(int fd, long ms) {
    struct timeval tv = { ms / 1000, (ms % 1000) * 1000 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* $RDMA_CNI_AGENT_TIMEOUT in seconds as milliseconds; anything unparsable is the default. Never 0:
 * SO_RCVTIMEO 0 would mean "wait forever", the opposite of a short timeout. */
static long ready_timeout_ms(void) {
    const char *s = getenv("RDMA_CNI_AGENT_TIMEOUT");
    if (!s || !*s) return READY_TIMEOUT_MS;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || v != v) return READY_TIMEOUT_MS;
    if (v > ANSWER_TIMEOUT_S) v = ANSWER_TIMEOUT_S;
    long ms = (long)(v * 1000);
    return ms < 1 ? 1 : ms;
}

static void close_all(const int *fds, int n) {
    for (int i = 0; i < n; i++) if (fds[i] >= 0) close(fds[i]);
}

/* The frame plus the caller's namespaces and root in one sendmsg; the rest (if any) with send. */
static int send_request(int fd, const struct buf *frame) {
    int fds[3];
    fds[0] = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    fds[1] = open("/proc/self/ns/mnt", O_RDONLY | O_CLOEXEC);
    fds[2] = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fds[0] < 0 || fds[1] < 0 || fds[2] < 0) {
        close_all(fds, 3);
        return -1;
    }
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = { frame->p, frame->len };
    struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                          .msg_controllen = sizeof control };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    ssize_t sent;
    do sent = sendmsg(fd, &msg, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    close_all(fds, 3);
    if (sent < 0) return -1;
    return send_all(fd, frame->p + sent, frame->len - (size_t)sent);
}

/* Reads the answer frame: items code, stdout, stderr. Returns 0 and fills them, or -1. */
static int recv_answer(int fd, int *code, struct buf *items) {
    unsigned char head[12];
    if (recv_exact(fd, head, 12) || memcmp(head, "RCN1", 4) || get_u32(head + 4) != 3) return -1;
    uint32_t size = get_u32(head + 8);
    if (size > MAX_FRAME) return -1;
    items->p = malloc(size + 1);
    items->len = size;
    if (!items->p || recv_exact(fd, items->p, size)) return -1;
    items->p[size] = 0;
    uint32_t pos = 0;
    for (int i = 0; i < 3; i++) {  /* validate the three lengths */
        if (pos + 4 > size) return -1;
        uint32_t n = get_u32(items->p + pos);
        if (n > size - pos - 4) return -1;
        pos += 4 + n;
    }
    if (pos != size) return -1;
    char num[16] = {0};
    uint32_t n0 = get_u32(items->p);
    if (n0 == 0 || n0 >= sizeof num) return -1;
    memcpy(num, items->p + 4, n0);
    *code = atoi(num);
    return 0;
}

static void write_item(int out, const unsigned char **pos) {
    uint32_t n = get_u32(*pos);
    const unsigned char *p = *pos + 4;
    while (n) {
        ssize_t w = write(out, p, n);
        if (w < 0) { if (errno == EINTR) continue; break; }
        p += w; n -= (size_t)w;
    }
    *pos += 4 + get_u32(*pos);
}

/* Runs the in-process implementation; the stdin we already consumed (if any: in != NULL) is
 * handed over in a memfd. */
static void fall_back(char **argv, const struct buf *in) {
    const char *prog = getenv("RDMA_CNI_FALLBACK");
    char path[PATH_MAX];
    if (!prog || !*prog) {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 16);
        if (n <= 0) { perror("rdma-cni-client: /proc/self/exe"); exit(5); }
        path[n] = 0;
        char *slash = strrchr(path, '/');
        strcpy(slash ? slash + 1 : path, "rdma-cni");
        prog = path;
    }
    if (in) {
        int mfd = memfd_create("rdma-cni-stdin", 0);
        if (mfd < 0 || (in->len && write(mfd, in->p, in->len) != (ssize_t)in->len) ||
            lseek(mfd, 0, SEEK_SET) < 0 || dup2(mfd, 0) < 0) {
            perror("rdma-cni-client: stdin for the fallback");
            exit(5);
        }
        close(mfd);
    }
    setenv("RDMA_CNI_AGENT", "off", 1);
    execv(prog, argv);
    fprintf(stderr, "rdma-cni-client: cannot run %s: %s\n", prog, strerror(errno));
    exit(5);
}

/* The CNI config's cniVersion for the error JSON, or 1.0.0 (no JSON parser here: a plain scan). */
static void config_version(const struct buf *in, char *out, size_t outlen) {
    snprintf(out, outlen, "1.0.0");
    const char *s = memmem(in->p ? (const char *)in->p : "", in->len, "\"cniVersion\"", 12);
    if (!s) return;
    s = memchr(s + 12, '"', in->len - (size_t)(s + 12 - (const char *)in->p));
    if (!s) return;
    const char *e = memchr(s + 1, '"', in->len - (size_t)(s + 1 - (const char *)in->p));
    if (!e || (size_t)(e - s - 1) >= outlen || e - s - 1 == 0) return;
    for (const char *c = s + 1; c < e; c++) if (!strchr("0123456789.", *c)) return;
    memcpy(out, s + 1, (size_t)(e - s - 1));
    out[e - s - 1] = 0;
}

/* The request frame: "RCN1", the item count, the body's size, the body. */
static void put_frame(struct buf *frame, const struct buf *body, size_t count) {
    put(frame, "RCN1", 4);
    put_u32(frame, (uint32_t)count);
    put_u32(frame, (uint32_t)body->len);
    put(frame, body->p, body->len);
}

/* After SKEW: the reason frame (one item), written to stderr; the caller falls back. */
static void report_skew(int fd) {
    unsigned char head[12];
    uint32_t size = 0;
    unsigned char *body = NULL;
    if (!recv_exact(fd, head, 12) && !memcmp(head, "RCN1", 4) && get_u32(head + 4) == 1 &&
        (size = get_u32(head + 8)) >= 4 && size <= 65536 && (body = malloc(size)) && !recv_exact(fd, body, size) &&
        get_u32(body) == size - 4) {
        fprintf(stderr, "rdma-cni-client: %.*s; running the call in-process\n", (int)(size - 4), body + 4);
    } else {
        fprintf(stderr, "rdma-cni-client: rdma-agent refused this client's wire versions (%s); running the "
                "call in-process\n", WIRE_OFFER);
    }
    free(body);
}

/* Connects to the agent at path, sends the frame (with the GO at its end, if it has one) and waits
 * up to ready_ms for READY: the connected socket, or -1 (no agent there, a path too long for a
 * socket, a refusal, no READY in time). */
static int open_call(const char *path, const struct buf *frame, long ready_ms) {
    struct sockaddr_un addr = { .sun_family = AF_UNIX };
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    set_timeout(fd, ready_ms);
    unsigned char reply = 0;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) || send_request(fd, frame) ||
        recv_exact(fd, &reply, 1) || reply != 'R') {
        if (reply == 'V') report_skew(fd);
        close(fd);
        return -1;
    }
    return fd;
}

/* The pid of the process listening on the socket (the agent), or 0 when the kernel does not say. */
static pid_t agent_pid(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) ? 0 : cred.pid;
}

/* 0 only when pid has surely exited: no such process, or a zombie not yet reaped. */
static int alive(pid_t pid) {
    if (pid <= 0) return 1;
    char path[64], stat[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno != ENOENT;
    ssize_t n = read(fd, stat, sizeof stat - 1);
    close(fd);
    if (n <= 0) return 1;
    stat[n] = 0;
    char *paren = strrchr(stat, ')');
    return !(paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X'));
}

/* The agent is gone, or goes within AGENT_DEATH_WAIT_MS: the worker's end may close before its
 * agent has finished dying when the runtime kills a container's processes all at once. */
#define AGENT_DEATH_WAIT_MS 1000
static int dies_soon(pid_t pid) {
    for (int waited = 0; alive(pid); waited += 20) {
        if (waited >= AGENT_DEATH_WAIT_MS) return 0;
        struct timespec step = { 0, 20 * 1000000L };
        nanosleep(&step, NULL);
    }
    return 1;
}

/* ---- the readiness probe ---- */

#define PROBE_PLUGIN "rdma-macvlan"
#define PROBE_AGAIN_MS 200
#define PROBE_ANSWER_MS 15000

static long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

/* One VERSION call, answered by a forked worker. 0 when it answered with supportedVersions, else
 * -1 and why. */
static int probe_once(const char *path, long ready_ms, char *why, size_t whylen) {
    static const char conf[] = "{\"cniVersion\":\"1.0.0\"}", verb[] = "CNI_COMMAND=VERSION";
    struct buf frame = {0}, body = {0}, items = {0};
    put_item(&body, PROBE_PLUGIN, strlen(PROBE_PLUGIN));
    put_item(&body, conf, strlen(conf));
    put_item(&body, verb, strlen(verb));
    put_item(&body, WIRE_OFFER, strlen(WIRE_OFFER));
    put_frame(&frame, &body, 4);
    put(&frame, "G", 1);  /* VERSION is safe to run twice: GO right behind the request */
    int fd = open_call(path, &frame, ready_ms), code = -1, rc = -1;
    if (fd < 0) {
        snprintf(why, whylen, "no agent answered on %s (absent, refusing, or not READY in %ld ms)", path,
                 ready_ms);
    } else {
        set_timeout(fd, PROBE_ANSWER_MS);
        if (recv_answer(fd, &code, &items)) {
            snprintf(why, whylen, "agent on %s broke off before answering VERSION", path);
        } else {
            const unsigned char *out = items.p + 4 + get_u32(items.p);
            uint32_t n = get_u32(out);
            if (code == 0 && memmem(out + 4, n, "supportedVersions", 17)) {
                snprintf(why, whylen, "agent on %s serves %s", path, PROBE_PLUGIN);
                rc = 0;
            } else {
                snprintf(why, whylen, "agent on %s answered VERSION with exit %d: %.*s", path, code,
                         (int)(n > 300 ? 300 : n), (const char *)(out + 4));
            }
        }
        close(fd);
    }
    free(frame.p);
    free(body.p);
    free(items.p);
    return rc;
}

static double seconds_arg(const char *flag, const char *s) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : -1;
    if (!s || errno || *end || v != v || v < 0 || v > ANSWER_TIMEOUT_S) {
        fprintf(stderr, "rdma-cni-client: %s needs seconds between 0 and %d, got %s\n", flag, ANSWER_TIMEOUT_S,
                s ? s : "nothing");
        exit(2);
    }
    return v;
}

/* The DaemonSet's readiness probe, the same check as `rdma-agent --probe`: a socket file alone
 * would not tell a wedged or code-mismatched agent from a serving one. Asked again every 0.2 s for
 * up to --probe-wait seconds while no agent answers (kubelet runs a probe that has no result yet as
 * the container starts, ~1 s before the agent listens). Why in C: kubelet runs it every 10 s on
 * every node, and the bundle's Python start-up cost ~140 ms of CPU per probe (measured). */
static int probe(int argc, char **argv) {
    const char *path = DEFAULT_SOCKET;
    double wait_s = 0, ready_s = 5;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--socket") && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--probe-wait")) wait_s = seconds_arg(argv[i], argv[i + 1]), i++;
        else if (!strcmp(argv[i], "--probe-timeout")) ready_s = seconds_arg(argv[i], argv[i + 1]), i++;
        else {
            fprintf(stderr, "rdma-cni-client: unknown probe argument %s (--socket PATH, --probe-wait S, "
                    "--probe-timeout S)\n", argv[i]);
            return 2;
        }
    }
    if (strlen(path) >= sizeof ((struct sockaddr_un *)0)->sun_path) {  /* no wait can mend that */
        fprintf(stderr, "rdma-agent probe: socket path too long: %s\n", path);
        return 1;
    }
    long ready_ms = ready_s * 1000 < 1 ? 1 : (long)(ready_s * 1000);
    long deadline = now_ms() + (long)(wait_s * 1000);
    char why[512];
    int rc = probe_once(path, ready_ms, why, sizeof why);
    while (rc && now_ms() + PROBE_AGAIN_MS <= deadline) {
        struct timespec pause = { 0, PROBE_AGAIN_MS * 1000000L };
        nanosleep(&pause, NULL);
        rc = probe_once(path, ready_ms, why, sizeof why);
    }
    fprintf(stderr, "rdma-agent probe: %s\n", why);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--probe")) return probe(argc, argv);
    const char *command = getenv("CNI_COMMAND");
    const char *off = getenv("RDMA_CNI_AGENT");
    struct buf in = {0};
    if (!command || !*command || (off && !strcmp(off, "off"))) fall_back(argv, NULL);
    if (read_all(0, &in) < 0) fall_back(argv, &in);

    const char *path = getenv("RDMA_CNI_AGENT_SOCKET");
    if (!path || !*path) path = DEFAULT_SOCKET;

    const char *name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    struct buf frame = {0}, body = {0};
    size_t count = 3;
    put_item(&body, name, strlen(name));
    put_item(&body, in.p ? in.p : (unsigned char *)"", in.len);
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, "RDMA_CNI_WIRE=", 14)) put_item(&body, *e, strlen(*e)), count++;
    }
    put_item(&body, WIRE_OFFER, strlen(WIRE_OFFER));
    put_frame(&frame, &body, count);

    /* Verbs that are safe to run twice send GO right behind the request (no wait for READY). */
    int eager = strcmp(command, "ADD") != 0;
    if (eager) put(&frame, "G", 1);

    int fd = open_call(path, &frame, ready_timeout_ms());
    if (fd < 0) fall_back(argv, &in);
    if (!eager && send_all(fd, (const unsigned char *)"G", 1)) {
        close(fd);
        fall_back(argv, &in);
    }
    /* Committed: the agent may be running the call now. */
    pid_t agent = agent_pid(fd);
    set_timeout(fd, ANSWER_TIMEOUT_S * 1000L);
    int code = 0;
    struct buf items = {0};
    errno = 0;
    if (recv_answer(fd, &code, &items)) {
        int timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
        close(fd);
        if (strcmp(command, "ADD")) fall_back(argv, &in);  /* DEL, CHECK, GC, STATUS, VERSION repeat safely */
        if (!timed_out && dies_soon(agent)) {
            fprintf(stderr, "rdma-cni-client: rdma-agent (pid %d) died during ADD, its workers with it: "
                    "running the call in-process\n", (int)agent);
            fall_back(argv, &in);
        }
        char version[32];
        config_version(&in, version, sizeof version);
        printf("{\"cniVersion\":\"%s\",\"code\":%d,\"msg\":\"rdma-agent stopped answering during ADD; the "
               "attachment's state is recorded, so DEL (or the agent's reconcile) restores the host; "
               "retry the pod\"}\n", version, TRY_AGAIN_LATER);
        return 1;
    }
    close(fd);
    const unsigned char *pos = items.p + 4 + get_u32(items.p);
    const unsigned char *err = pos + 4 + get_u32(pos);
    write_item(2, &err);
    write_item(1, &pos);
    return code;
}
