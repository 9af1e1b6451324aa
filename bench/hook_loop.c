/* The kernel-hook cost loop of bench/run (issue 13, target 4): N calls of one kind, timed.
 *
 *   hook_loop tcp IP PORT N   N x (socket(2) + connect(2) + close(2)), TCP
 *   hook_loop udp IP PORT N   N x sendto(2) of 16 bytes on one unconnected UDP socket
 *
 * Prints one JSON line: {"mode", "n", "ok", "errno": {NAME: count}, "ns_per_call",
 * "cpu_ns_per_call"}: "ok" counts calls that returned 0 (or, for sendto, 16); the CPU time is
 * the process's user + system time (getrusage(2)), where the hooks run, so it does not count
 * the time other processes on a shared machine took. IPv4 only. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_ERRNO 256

static double cpu(void)
{
	struct rusage r;
	getrusage(RUSAGE_SELF, &r);
	return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: %s tcp|udp IP PORT N\n", argv[0]);
		return 2;
	}
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1)
		return 2;
	long n = atol(argv[4]), ok = 0, errs[MAX_ERRNO] = {0};
	int tcp = strcmp(argv[1], "tcp") == 0;
	int udp = tcp ? -1 : socket(AF_INET, SOCK_DGRAM, 0);
	char msg[16] = "gatewrap bench\n";
	double t0 = now(), c0 = cpu();
	for (long i = 0; i < n; i++) {
		int r;
		if (tcp) {
			int s = socket(AF_INET, SOCK_STREAM, 0);
			r = connect(s, (struct sockaddr *)&a, sizeof(a));
			if (r != 0)
				errs[errno < MAX_ERRNO ? errno : 0]++;
			close(s);
		} else {
			r = sendto(udp, msg, sizeof(msg), 0, (struct sockaddr *)&a, sizeof(a)) == sizeof(msg) ? 0 : -1;
			if (r != 0)
				errs[errno < MAX_ERRNO ? errno : 0]++;
		}
		ok += r == 0;
	}
	double secs = now() - t0, cpus = cpu() - c0;
	printf("{\"mode\": \"%s\", \"n\": %ld, \"ok\": %ld, \"errno\": {", argv[1], n, ok);
	const char *sep = "";
	for (int e = 0; e < MAX_ERRNO; e++)
		if (errs[e]) {
			printf("%s\"%s\": %ld", sep, strerrorname_np(e) ? strerrorname_np(e) : "?", errs[e]);
			sep = ", ";
		}
	printf("}, \"ns_per_call\": %.1f, \"cpu_ns_per_call\": %.1f}\n", secs * 1e9 / n, cpus * 1e9 / n);
	return 0;
}
