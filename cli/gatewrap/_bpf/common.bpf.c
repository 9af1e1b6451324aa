/* Maps and helpers shared by every gatewrap hook. The loader compiles the program
 * files as one text with this file first: bcc rewrites map calls (gw_runs.lookup())
 * only in its main text, not in included headers. */
#include <uapi/linux/bpf.h>
#include <uapi/asm-generic/errno-base.h>
#include "gate.h"

/* The socket ABI values the hooks compare with (socket(2), include/uapi/linux/in.h), written
 * out: the kernel defines AF_* and SOCK_* only in its internal linux/socket.h and linux/net.h
 * (uapi/linux/in.h includes the former), which pull in hundreds of kernel headers that bcc
 * parses twice per compile: 2-3 s of a cold start, against ~0.1 s for these lines. SOCK_*
 * differ on MIPS only (arch/mips/include/asm/socket.h), where gatewrap does not run. */
#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17

BPF_TABLE_PINNED("hash", u64, struct gw_run_config, gw_runs, GW_MAX_RUNS,
		 GW_PIN_DIR "/gw_runs");
/* Template for the per-run ring buffers the loader creates. */
BPF_RINGBUF_OUTPUT(gw_events_tmpl, 1);
/* Never written: it hands the loader struct gw_event as bcc parsed it (its Leaf type),
 * so Python decodes events from this one definition. */
BPF_ARRAY(gw_event_layout, struct gw_event, 1);
BPF_TABLE_PINNED("hash_of_maps$gw_events_tmpl", u64, int, gw_events, GW_MAX_RUNS,
		 GW_PIN_DIR "/gw_events");
/* Events that found no ring buffer or a full one, per run cgroup. */
BPF_TABLE_PINNED("lru_hash", u64, u64, gw_lost, GW_MAX_RUNS, GW_PIN_DIR "/gw_lost");
/* Identical denials of a run, folded. A plain hash, not an LRU one: an LRU map would evict
 * an entry (and its pending count) without telling the program; a full hash refuses the
 * insert, and the denial goes out unfolded. Allocated on demand (BPF_F_NO_PREALLOC = 1).
 * The loader reports what is left in it at the run's end (RunHooks.flush). */
BPF_TABLE_PINNED("hash", struct gw_fold_key, struct gw_fold, gw_folds, GW_MAX_FOLDS,
		 GW_PIN_DIR "/gw_folds", 1);
/* A new gw_folds value is built here: with the key and the event it is too big for the
 * 512-byte BPF stack. */
BPF_PERCPU_ARRAY(gw_scratch, struct gw_fold, 1);
/* gw_folds entries per run; the loader creates a run's counter (0) with its config. */
BPF_TABLE_PINNED("hash", u64, u64, gw_fold_keys, GW_MAX_RUNS, GW_PIN_DIR "/gw_fold_keys");
/* ... and those of its refused writes (GW_HOOK_SYS_EXIT), counted apart: writes to read-only
 * paths never take the keys of the run's egress denials. */
BPF_TABLE_PINNED("hash", u64, u64, gw_refused_keys, GW_MAX_RUNS, GW_PIN_DIR "/gw_refused_keys");

static __always_inline int port_in(const __u16 *ports, __u16 port)
{
#pragma unroll
	for (int i = 0; i < GW_MAX_PORTS; i++)
		if (ports[i] != 0 && ports[i] == port)
			return 1;
	return 0;
}

/* The gate listens on TCP ports and (for a DNS stub) UDP ports; nothing else is open. */
static __always_inline int port_allowed(const struct gw_run_config *cfg, int udp, __u16 port)
{
	return port_in(udp ? cfg->udp_ports : cfg->tcp_ports, port);
}

static __always_inline int is_gate4(const struct gw_run_config *cfg, int udp, __u32 ip4, __u16 port)
{
	return ip4 == cfg->gate_ip4 && port_allowed(cfg, udp, port);
}

/* connect6 sees v4-mapped destinations (::ffff:a.b.c.d) as IPv6. */
static __always_inline int is_gate6(const struct gw_run_config *cfg, int udp, const __u32 *ip6, __u16 port)
{
	if (!port_allowed(cfg, udp, port))
		return 0;
	if (ip6[0] == cfg->gate_ip6[0] && ip6[1] == cfg->gate_ip6[1] &&
	    ip6[2] == cfg->gate_ip6[2] && ip6[3] == cfg->gate_ip6[3])
		return 1;
	return ip6[0] == 0 && ip6[1] == 0 && ip6[2] == bpf_htonl(0x0000ffff) &&
	       ip6[3] == cfg->gate_ip4;
}

static __always_inline void count_lost(__u64 cgid)
{
	__u64 one = 1, *n = gw_lost.lookup(&cgid);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		gw_lost.update(&cgid, &one);
}

/* Who is asking: the current task (valid in sock_addr and sock_create hooks). */
static __always_inline void fill_task(struct gw_event *ev, __u64 cgid)
{
	__u64 id = bpf_get_current_pid_tgid();

	ev->cgroup_id = cgid;
	ev->pid = (__u32)id;
	ev->tgid = id >> 32;
	ev->uid = (__u32)bpf_get_current_uid_gid();
	bpf_get_current_comm(&ev->comm, sizeof(ev->comm));
}

static __always_inline int emit(void *rb, struct gw_event *ev)
{
	return bpf_ringbuf_output(rb, ev, sizeof(*ev), 0);
}

static __always_inline void fold_key_of(struct gw_fold_key *k, const struct gw_event *ev)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->cgroup_id = ev->cgroup_id;
	k->tgid = ev->hook == GW_HOOK_SYS_EXIT ? 0 : ev->tgid;
	k->family = ev->family;
	k->dst_port = ev->dst_port;
	k->sock_type = ev->sock_type;
	k->protocol = ev->protocol;
	k->hook = ev->hook;
	k->verdict = ev->verdict;
	k->path_len = ev->path_len;
	__builtin_memcpy(k->dst, &ev->dst, sizeof(k->dst));
}

/* A repeat: count it; if the interval since the denial's last event has passed, the one
 * CPU that wins the compare-and-swap on emitted_ns takes every pending attempt (xchg) into
 * one event. A failed send puts them back: they go into a later event or the final flush. */
static __always_inline void fold_repeat(void *rb, struct gw_fold *f, struct gw_event *ev, __u64 now)
{
	__u64 since, n;

	__sync_fetch_and_add(&f->pending, 1);
	f->last_ns = now;
	if (!f->first_ns)
		f->first_ns = now;  /* the overflow entry, created empty by the loader */
	since = f->emitted_ns;
	if (now - since < GW_FOLD_INTERVAL_NS)
		return;
	if (__sync_val_compare_and_swap(&f->emitted_ns, since, now) != since)
		return;
	n = __sync_lock_test_and_set(&f->pending, 0);
	if (n == 0)
		return;
	ev->count = n;
	ev->first_ns = f->first_ns;
	ev->last_ns = now;
	if (emit(rb, ev) != 0)
		__sync_fetch_and_add(&f->pending, n);
}

/* A denial the run has no room to fold on its own: into the run's overflow entry (``k`` is
 * overwritten with that entry's key). */
static __always_inline void fold_overflow(void *rb, struct gw_fold_key *k, struct gw_event *ev, __u64 now)
{
	struct gw_fold *f;

	__builtin_memset(k, 0, sizeof(*k));
	k->cgroup_id = ev->cgroup_id;
	k->overflow = 1;
	k->verdict = ev->verdict == GW_ALLOW_UNIX || ev->verdict == GW_REFUSED_WRITE ? ev->verdict : 0;
	f = gw_folds.lookup(k);
	ev->overflow = 1;
	if (f) {
		fold_repeat(rb, f, ev, now);
		return;
	}
	ev->count = 1;  /* no overflow entry (the loader always makes one): unfolded */
	ev->first_ns = now;
	ev->last_ns = now;
	if (emit(rb, ev) != 0)
		count_lost(ev->cgroup_id);
}

/* A first attempt: remember it (within the run's quota of keys) and send it at once, so the
 * live notice is immediate. Returns 0 when it is handled, -1 when the caller must fold it
 * as a repeat (another CPU inserted the same key first). fold_overflow is called from one
 * place: each call inlines it, fold_repeat with it. */
static __always_inline int fold_first(void *rb, struct gw_fold_key *k, struct gw_event *ev, __u64 now)
{
	int refused = ev->hook == GW_HOOK_SYS_EXIT;
	__u64 *keys = refused ? gw_refused_keys.lookup(&ev->cgroup_id) : gw_fold_keys.lookup(&ev->cgroup_id);
	int zero = 0;
	struct gw_fold *f = gw_scratch.lookup(&zero);
	struct gw_fold *got;
	int err;

	if (f && keys && *keys < (refused ? GW_MAX_REFUSED_WRITE_FOLDS : GW_MAX_FOLDS_PER_RUN)) {
		ev->count = 1;
		ev->first_ns = now;
		ev->last_ns = now;
		f->pending = 0;
		f->emitted_ns = now;
		f->first_ns = now;
		f->last_ns = now;
		f->first = *ev;
		err = gw_folds.insert(k, f);
		if (err == -EEXIST)
			return -1;
		if (err == 0) {
			__sync_fetch_and_add(keys, 1);
			if (emit(rb, ev) == 0)
				return 0;
			got = gw_folds.lookup(k);
			if (got)
				__sync_fetch_and_add(&got->pending, 1);
			else
				count_lost(ev->cgroup_id);
			return 0;
		}
	}
	fold_overflow(rb, k, ev, now);  /* the run's quota is used up, or gw_folds is full */
	return 0;
}

/* Record the event, folded with its identical repeats. Without a ring buffer (no run) it
 * is only counted lost. */
static __always_inline void record(struct gw_event *ev)
{
	__u64 cgid = ev->cgroup_id, now = bpf_ktime_get_ns();
	void *rb = gw_events.lookup(&cgid);
	struct gw_fold_key k;
	struct gw_fold *f;

	if (!rb) {
		count_lost(cgid);
		return;
	}
	fold_key_of(&k, ev);
	f = gw_folds.lookup(&k);
	if (!f && fold_first(rb, &k, ev, now) == 0)
		return;
	if (!f)
		f = gw_folds.lookup(&k);
	if (f)
		fold_repeat(rb, f, ev, now);
	else
		count_lost(cgid);
}

/* Record the denial and refuse: the syscall gets EPERM, every time, whatever happens to
 * the record. */
static __always_inline int deny(struct gw_event *ev)
{
	record(ev);
	return 0;
}
