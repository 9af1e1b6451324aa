/* Shared definitions for gatewrap's cgroup hooks. The loader (cli/gatewrap/bpf/)
 * decodes events from this one definition through bcc's table.event(). */
#ifndef GATEWRAP_GATE_H
#define GATEWRAP_GATE_H

/* Gate ports per run; the loader refuses more. */
#define GW_MAX_PORTS 4
/* Concurrent runs (entries in the per-cgroup maps): an agent host's thousand sandboxes of
 * the shared mode, with room to spare. */
#define GW_MAX_RUNS 4096
/* Distinct denials being folded (gw_folds entries), over all runs and per run. A run's
 * denials beyond them are folded together in the run's overflow entry (created with its
 * config): counted exactly, without their destination. */
#define GW_MAX_FOLDS 65536
#define GW_MAX_FOLDS_PER_RUN 4096
/* A run's refused writes (GW_HOOK_SYS_EXIT) are folded one by one up to this many distinct
 * ones, on a quota of their own (gw_refused_keys): a tool writing to a thousand read-only
 * paths never folds the run's egress denials into their overflow entry. */
#define GW_MAX_REFUSED_WRITE_FOLDS 1024
/* Repeats of a denial within this many nanoseconds of its last event are folded into
 * the next one (the loader sets it with -DGW_FOLD_INTERVAL_NS=...). */
/* sun_path of struct sockaddr_un (include/uapi/linux/un.h). */
#define GW_UNIX_PATH 108
#ifndef GW_FOLD_INTERVAL_NS
#define GW_FOLD_INTERVAL_NS 1000000000ULL
#endif

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
	GW_HOOK_CONNECT_UNIX = 8,       /* event.dst.path holds the address (Linux 6.7+) */
	GW_HOOK_SENDMSG_UNIX = 9,
	GW_HOOK_SYS_EXIT = 10,          /* raw_tracepoint/sys_exit: a write-class syscall refused
					 * (attempts.bpf.c); dst.path holds a path it was given */
};

enum gw_verdict {
	GW_DENY_NOT_GATE = 1,   /* destination is not one of the gate's listeners */
	GW_DENY_NO_RUN = 2,     /* the task's cgroup has no run config: fail closed */
	GW_DENY_NO_ADDR = 3,    /* sendmsg saw a zeroed destination (control message) */
	GW_DENY_SOCK_KIND = 4,  /* socket type/protocol other than TCP or UDP (raw, ping, SCTP, ...) */
	GW_DENY_IP_OPTIONS = 5, /* IPv4 options or IPv6 extension headers (source routing) */
	GW_DENY_FAMILY = 6,     /* a destination of another address family than the hook's */
	GW_ALLOW_UNIX = 7,      /* a unix socket address: allowed (the jail's mount namespace
				 * decides which exist), recorded */
	GW_REFUSED_WRITE = 8,   /* a syscall that changes a path got EROFS or EBUSY (the jail's
				 * read-only mounts: protected paths, or any read-only folder):
				 * only reported, the kernel refused it already */
};

/* Per-run configuration, keyed by the run's cgroup id (cgroup directory inode). */
struct gw_run_config {
	__u32 gate_ip4;                 /* network byte order, e.g. 127.0.0.1 */
	__u32 gate_ip6[4];              /* network byte order, e.g. ::1 */
	__u16 tcp_ports[GW_MAX_PORTS];  /* host byte order; 0 = unused slot */
	__u16 udp_ports[GW_MAX_PORTS];  /* host byte order; 0 = unused slot (e.g. a DNS stub) */
};

/* One denied attempt, as put on the run's ring buffer. A GW_HOOK_SYS_EXIT event (a refused
 * write) uses the socket fields for its own: family = the errno (EROFS 30, EBUSY 16),
 * protocol = the syscall number (x86-64), sock_type = the directory fd the path is relative
 * to (AT_FDCWD -100 as __u32), dst_port = which path argument (0: the one changed, or a
 * rename's or link's source; 1: a rename's or link's destination), dst.path the path as the
 * syscall got it (path_len bytes, cut at GW_UNIX_PATH - 1). */
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
	__u8 overflow;                  /* 1: count covers any denial of the run beyond GW_MAX_FOLDS_PER_RUN */
	__u8 pad;
	__u16 path_len;                 /* unix hooks: bytes of dst.path in use */
	__u16 pad2;
	union {
		__u32 v4;               /* network byte order */
		__u32 v6[4];            /* network byte order */
		char path[GW_UNIX_PATH]; /* sun_path; abstract names start with a NUL */
	} dst;
	char comm[16];
	__u64 count;                    /* attempts this event stands for (>= 1) */
	__u64 first_ns;                 /* bpf_ktime_get_ns() of the denial's first attempt in the run */
	__u64 last_ns;                  /* ... and of its latest one */
};

/* What makes two denials "the same" (folded together): the same process (tgid) and the
 * event's fields but its thread, uid, comm and counts; for refused writes any process of
 * the run (tgid 0: a shell loop makes a process per attempt). A run has three overflow entries,
 * with overflow = 1, verdict 0 (denials), GW_ALLOW_UNIX or GW_REFUSED_WRITE, and every other field but
 * cgroup_id 0. */
struct gw_fold_key {
	__u64 cgroup_id;
	__u32 tgid;
	__u32 sock_type;
	__u32 protocol;
	__u16 family;
	__u16 dst_port;
	__u8 hook;
	__u8 verdict;
	__u8 overflow;
	__u8 pad;
	__u16 path_len;
	__u16 pad2;
	char dst[GW_UNIX_PATH];         /* the event's dst union */
};

/* A denial being folded: attempts not yet reported, and the first attempt's event (its
 * task is what the run's last record of the denial names). */
struct gw_fold {
	__u64 pending;                  /* attempts since the last event, not in any event yet */
	__u64 emitted_ns;               /* when the last event of this denial was sent */
	__u64 first_ns;
	__u64 last_ns;
	struct gw_event first;
};

#endif
