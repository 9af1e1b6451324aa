/* Shared definitions for gatewrap's cgroup hooks. The loader (cli/gatewrap/bpf/)
 * decodes events from this one definition through bcc's table.event(). */
#ifndef GATEWRAP_GATE_H
#define GATEWRAP_GATE_H

/* Gate ports per run; the loader refuses more. */
#define GW_MAX_PORTS 4
/* Concurrent runs (entries in the per-cgroup maps). */
#define GW_MAX_RUNS 1024

#ifndef GW_PIN_DIR
#error "GW_PIN_DIR must be set by the loader (cflags -DGW_PIN_DIR=\"...\")"
#endif

enum gw_hook {
	GW_HOOK_CONNECT4 = 1,
	GW_HOOK_CONNECT6 = 2,
	GW_HOOK_SENDMSG4 = 3,
	GW_HOOK_SENDMSG6 = 4,
	GW_HOOK_SOCK_CREATE = 5,
	GW_HOOK_SKB_EGRESS = 6,
	GW_HOOK_SETSOCKOPT = 7,         /* event.protocol holds the option name */
};

enum gw_verdict {
	GW_DENY_NOT_GATE = 1,   /* destination is not one of the gate's listeners */
	GW_DENY_NO_RUN = 2,     /* the task's cgroup has no run config: fail closed */
	GW_DENY_NO_ADDR = 3,    /* sendmsg saw a zeroed destination (control message) */
	GW_DENY_SOCK_KIND = 4,  /* socket type/protocol other than TCP or UDP (raw, ping, SCTP, ...) */
	GW_DENY_IP_OPTIONS = 5, /* IPv4 options or IPv6 extension headers (source routing) */
	GW_DENY_FAMILY = 6,     /* a destination of another address family than the hook's */
};

/* Per-run configuration, keyed by the run's cgroup id (cgroup directory inode). */
struct gw_run_config {
	__u32 gate_ip4;                 /* network byte order, e.g. 127.0.0.1 */
	__u32 gate_ip6[4];              /* network byte order, e.g. ::1 */
	__u16 tcp_ports[GW_MAX_PORTS];  /* host byte order; 0 = unused slot */
	__u16 udp_ports[GW_MAX_PORTS];  /* host byte order; 0 = unused slot (e.g. a DNS stub) */
};

/* One denied attempt, as put on the run's ring buffer. */
struct gw_event {
	__u64 cgroup_id;
	__u32 pid;                      /* thread id (kernel pid); 0 when unknown (skb hooks) */
	__u32 tgid;                     /* process id */
	__u32 uid;
	__u16 family;                   /* AF_INET (2) or AF_INET6 (10) */
	__u16 dst_port;                 /* host byte order */
	__u32 sock_type;                /* SOCK_STREAM (1), SOCK_DGRAM (2), ... */
	__u32 protocol;                 /* IPPROTO_* */
	__u8 hook;                      /* enum gw_hook */
	__u8 verdict;                   /* enum gw_verdict */
	__u8 pad[6];
	union {
		__u32 v4;               /* network byte order */
		__u32 v6[4];            /* network byte order */
	} dst;
	char comm[16];
};

#endif
