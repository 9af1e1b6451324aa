/* Attempts the escape suite makes where Python cannot: io_uring (raw syscalls, no
 * liburing) and sendmmsg. One attempt per run; prints one JSON line:
 *   {"step": MODE, "res": N, "errno": "EPERM", "elapsed": SECONDS}
 * where res/errno are the syscall's (or the CQE's) result.
 *
 *   escape_probe uring-connect    IP PORT [async|sqpoll]  IORING_OP_CONNECT on a TCP socket
 *   escape_probe uring-socket     IP PORT                  IORING_OP_SOCKET, then IORING_OP_CONNECT
 *   escape_probe uring-sendmsg    IP PORT                  IORING_OP_SENDMSG, unconnected UDP
 *   escape_probe sendmmsg IP PORT IP PORT                  one sendmmsg(2) of two UDP datagrams
 *   escape_probe flood IP PORT N [IP PORT]... [-- ARG...]  N TCP connect(2)s, round robin over the
 *       destinations (one socket each; ARGs after "--" only lengthen the command line); prints
 *       {"step", "res": N, "eperm": how many got EPERM, "errno": the first other errno or
 *       "EPERM", "elapsed", "cpu": the probe's user+system seconds}; the alarm is 60 s
 *
 * An alarm bounds every attempt (3 s): a hang prints errno "TIMEOUT". */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static struct timespec t0;
static const char *step = "?";

static double elapsed(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9;
}

static void report(long res, int err)
{
	const char *name = err ? strerrorname_np(err) : "";
	printf("{\"step\": \"%s\", \"res\": %ld, \"errno\": \"%s\", \"elapsed\": %.6f}\n",
	       step, res, name ? name : "?", elapsed());
	fflush(stdout);
}

static void on_alarm(int sig)
{
	(void)sig;
	printf("{\"step\": \"%s\", \"res\": 0, \"errno\": \"TIMEOUT\", \"elapsed\": %.6f}\n", step, elapsed());
	fflush(stdout);
	_exit(3);
}

/* Fills a sockaddr for IP (v4 or v6 literal) and PORT; returns its length. */
static socklen_t addr_of(const char *ip, const char *port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (strchr(ip, ':')) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
		a->sin6_family = AF_INET6;
		a->sin6_port = htons(atoi(port));
		if (inet_pton(AF_INET6, ip, &a->sin6_addr) != 1)
			exit(2);
		return sizeof(*a);
	}
	struct sockaddr_in *a = (struct sockaddr_in *)ss;
	a->sin_family = AF_INET;
	a->sin_port = htons(atoi(port));
	if (inet_pton(AF_INET, ip, &a->sin_addr) != 1)
		exit(2);
	return sizeof(*a);
}

struct ring {
	int fd;
	unsigned *sq_tail, *sq_mask, *sq_array, *sq_flags;
	unsigned *cq_head, *cq_tail, *cq_mask;
	struct io_uring_sqe *sqes;
	struct io_uring_cqe *cqes;
	int sqpoll;
};

static void ring_setup(struct ring *r, int sqpoll)
{
	struct io_uring_params p;

	memset(&p, 0, sizeof(p));
	if (sqpoll) {
		p.flags = IORING_SETUP_SQPOLL;
		p.sq_thread_idle = 1000;
	}
	r->sqpoll = sqpoll;
	r->fd = syscall(__NR_io_uring_setup, 8, &p);
	if (r->fd < 0) {
		step = "io_uring_setup";
		report(-1, errno);
		exit(1);
	}
	size_t sq_sz = p.sq_off.array + p.sq_entries * sizeof(unsigned);
	size_t cq_sz = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
	if (p.features & IORING_FEAT_SINGLE_MMAP)
		sq_sz = cq_sz = sq_sz > cq_sz ? sq_sz : cq_sz;
	char *sq = mmap(NULL, sq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
	char *cq = sq;
	if (!(p.features & IORING_FEAT_SINGLE_MMAP))
		cq = mmap(NULL, cq_sz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_CQ_RING);
	r->sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
		       MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
	if (sq == MAP_FAILED || cq == MAP_FAILED || r->sqes == MAP_FAILED) {
		step = "mmap";
		report(-1, errno);
		exit(1);
	}
	r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
	r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
	r->sq_array = (unsigned *)(sq + p.sq_off.array);
	r->sq_flags = (unsigned *)(sq + p.sq_off.flags);
	r->cq_head = (unsigned *)(cq + p.cq_off.head);
	r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
	r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
	r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
}

/* Submits one SQE and waits for its CQE; returns the CQE's res. */
static int ring_do(struct ring *r, const struct io_uring_sqe *sqe)
{
	unsigned tail = *r->sq_tail;
	unsigned idx = tail & *r->sq_mask;

	r->sqes[idx] = *sqe;
	r->sq_array[idx] = idx;
	__atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
	unsigned flags = IORING_ENTER_GETEVENTS;
	unsigned to_submit = 1;
	if (r->sqpoll) {
		to_submit = 0;  /* the kernel's SQ thread submits */
		if (__atomic_load_n(r->sq_flags, __ATOMIC_ACQUIRE) & IORING_SQ_NEED_WAKEUP)
			flags |= IORING_ENTER_SQ_WAKEUP;
	}
	for (;;) {
		unsigned head = __atomic_load_n(r->cq_head, __ATOMIC_ACQUIRE);
		if (head != __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) {
			int res = r->cqes[head & *r->cq_mask].res;
			__atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
			return res;
		}
		if (syscall(__NR_io_uring_enter, r->fd, to_submit, 1, flags, NULL, 0) < 0 && errno != EINTR) {
			step = "io_uring_enter";
			report(-1, errno);
			exit(1);
		}
		to_submit = 0;
	}
}

static void cqe_report(int res)
{
	report(res, res < 0 ? -res : 0);
}

int main(int argc, char **argv)
{
	struct sockaddr_storage ss, ss2;
	socklen_t len, len2;

	if (argc < 4)
		return 2;
	signal(SIGALRM, on_alarm);
	alarm(3);
	step = argv[1];
	len = addr_of(argv[2], argv[3], &ss);
	int family = ss.ss_family;
	clock_gettime(CLOCK_MONOTONIC, &t0);

	if (!strcmp(argv[1], "uring-connect")) {
		const char *how = argc > 4 ? argv[4] : "";
		struct ring r;
		struct io_uring_sqe sqe;
		int fd = socket(family, SOCK_STREAM, 0);
		if (fd < 0) {
			report(-1, errno);
			return 1;
		}
		ring_setup(&r, !strcmp(how, "sqpoll"));
		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = IORING_OP_CONNECT;
		sqe.fd = fd;
		sqe.addr = (uintptr_t)&ss;
		sqe.off = len;
		if (!strcmp(how, "async"))
			sqe.flags = IOSQE_ASYNC;  /* forced to an io-wq worker thread */
		clock_gettime(CLOCK_MONOTONIC, &t0);
		cqe_report(ring_do(&r, &sqe));
		return 0;
	}
	if (!strcmp(argv[1], "uring-socket")) {
		struct ring r;
		struct io_uring_sqe sqe;
		ring_setup(&r, 0);
		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = IORING_OP_SOCKET;
		sqe.fd = family;
		sqe.off = SOCK_STREAM;
		sqe.len = 0;
		int fd = ring_do(&r, &sqe);
		if (fd < 0) {
			step = "uring-socket (IORING_OP_SOCKET)";
			cqe_report(fd);
			return 0;
		}
		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = IORING_OP_CONNECT;
		sqe.fd = fd;
		sqe.addr = (uintptr_t)&ss;
		sqe.off = len;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		cqe_report(ring_do(&r, &sqe));
		return 0;
	}
	if (!strcmp(argv[1], "uring-sendmsg")) {
		struct ring r;
		struct io_uring_sqe sqe;
		char payload[] = "x";
		struct iovec iov = { payload, 1 };
		struct msghdr msg = { .msg_name = &ss, .msg_namelen = len, .msg_iov = &iov, .msg_iovlen = 1 };
		int fd = socket(family, SOCK_DGRAM, 0);
		ring_setup(&r, 0);
		memset(&sqe, 0, sizeof(sqe));
		sqe.opcode = IORING_OP_SENDMSG;
		sqe.fd = fd;
		sqe.addr = (uintptr_t)&msg;
		sqe.len = 1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		cqe_report(ring_do(&r, &sqe));
		return 0;
	}
	if (!strcmp(argv[1], "sendmmsg")) {
		if (argc < 6)
			return 2;
		len2 = addr_of(argv[4], argv[5], &ss2);
		char payload[] = "x";
		struct iovec iov = { payload, 1 };
		struct mmsghdr m[2];
		memset(m, 0, sizeof(m));
		m[0].msg_hdr = (struct msghdr){ .msg_name = &ss, .msg_namelen = len, .msg_iov = &iov, .msg_iovlen = 1 };
		m[1].msg_hdr = (struct msghdr){ .msg_name = &ss2, .msg_namelen = len2, .msg_iov = &iov, .msg_iovlen = 1 };
		int fd = socket(family, SOCK_DGRAM, 0);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		int n = sendmmsg(fd, m, 2, 0);
		report(n, n < 0 ? errno : 0);
		return 0;
	}
	if (!strcmp(argv[1], "flood")) {
		enum { MAX_DST = 16 };
		struct sockaddr_storage dst[MAX_DST];
		socklen_t dlen[MAX_DST];
		int fds[MAX_DST], nd = 0, other = 0;
		long n = argc > 4 ? atol(argv[4]) : 0, eperm = 0;
		dst[0] = ss;
		dlen[0] = len;
		nd = 1;
		for (int i = 5; i + 1 < argc && strcmp(argv[i], "--") && nd < MAX_DST; i += 2, nd++)
			dlen[nd] = addr_of(argv[i], argv[i + 1], &dst[nd]);
		for (int i = 0; i < nd; i++)
			fds[i] = socket(dst[i].ss_family, SOCK_STREAM, 0);
		alarm(60);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (long i = 0; i < n; i++) {
			int d = i % nd;
			if (connect(fds[d], (struct sockaddr *)&dst[d], dlen[d]) == 0)
				other = other ? other : -1;
			else if (errno == EPERM)
				eperm++;
			else if (!other)
				other = errno;
		}
		const char *name = other > 0 ? strerrorname_np(other) : other ? "connected" : "EPERM";
		struct rusage ru;
		getrusage(RUSAGE_SELF, &ru);
		double cpu = ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
			     (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
		printf("{\"step\": \"flood\", \"res\": %ld, \"eperm\": %ld, \"errno\": \"%s\", "
		       "\"elapsed\": %.6f, \"cpu\": %.6f}\n", n, eperm, name ? name : "?", elapsed(), cpu);
		fflush(stdout);
		return 0;
	}
	return 2;
}
