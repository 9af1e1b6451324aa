/* cgroup sock_addr hooks: connect4/6 and sendmsg4/6 (unconnected UDP).
 * Attached once to the gatewrap/ parent cgroup with BPF_F_ALLOW_MULTI: a NONE or
 * OVERRIDE attachment can be detached by an unprivileged process holding a
 * read-only fd on the cgroup (measured on 6.18), a MULTI one cannot. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/in.h>
#include <uapi/linux/in6.h>
#include <linux/socket.h>
#include "gate.h"

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

static __always_inline int port_allowed(const struct gw_run_config *cfg, __u16 port)
{
#pragma unroll
	for (int i = 0; i < GW_MAX_PORTS; i++)
		if (cfg->ports[i] != 0 && cfg->ports[i] == port)
			return 1;
	return 0;
}

static __always_inline int is_gate4(const struct gw_run_config *cfg, __u32 ip4, __u16 port)
{
	return ip4 == cfg->gate_ip4 && port_allowed(cfg, port);
}

/* connect6 sees v4-mapped destinations (::ffff:a.b.c.d) as IPv6. */
static __always_inline int is_gate6(const struct gw_run_config *cfg, const __u32 *ip6, __u16 port)
{
	if (!port_allowed(cfg, port))
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

/* Fill the fields every sock_addr hook may read; the caller sets ev->dst, since
 * the verifier rejects user_ip6 reads in v4 hooks and user_ip4 reads in v6 hooks. */
static __always_inline void fill_event(struct gw_event *ev, struct bpf_sock_addr *ctx,
				       __u64 cgid, __u8 hook, __u8 verdict)
{
	__u64 id = bpf_get_current_pid_tgid();

	ev->cgroup_id = cgid;
	ev->pid = (__u32)id;
	ev->tgid = id >> 32;
	ev->uid = (__u32)bpf_get_current_uid_gid();
	ev->family = ctx->user_family;
	ev->dst_port = bpf_ntohs((__u16)ctx->user_port);
	ev->sock_type = ctx->type;
	ev->protocol = ctx->protocol;
	ev->hook = hook;
	ev->verdict = verdict;
	bpf_get_current_comm(&ev->comm, sizeof(ev->comm));
}

/* Put the event on the run's ring buffer (or count it lost) and refuse: the syscall gets EPERM. */
static __always_inline int deny(struct gw_event *ev)
{
	__u64 cgid = ev->cgroup_id;
	void *rb = gw_events.lookup(&cgid);

	if (!rb || bpf_ringbuf_output(rb, ev, sizeof(*ev), 0) != 0)
		count_lost(cgid);
	return 0;
}

static __always_inline int deny4(struct bpf_sock_addr *ctx, __u64 cgid, __u8 hook, __u8 verdict)
{
	struct gw_event ev = {};

	fill_event(&ev, ctx, cgid, hook, verdict);
	ev.dst.v4 = ctx->user_ip4;
	return deny(&ev);
}

static __always_inline int deny6(struct bpf_sock_addr *ctx, __u64 cgid, __u8 hook, __u8 verdict,
				 const __u32 *ip6)
{
	struct gw_event ev = {};

	fill_event(&ev, ctx, cgid, hook, verdict);
	ev.dst.v6[0] = ip6[0];
	ev.dst.v6[1] = ip6[1];
	ev.dst.v6[2] = ip6[2];
	ev.dst.v6[3] = ip6[3];
	return deny(&ev);
}

static __always_inline int check4(struct bpf_sock_addr *ctx, __u8 hook)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct gw_run_config *cfg = gw_runs.lookup(&cgid);

	if (!cfg)
		return deny4(ctx, cgid, hook, GW_DENY_NO_RUN);
	/* With a control message (e.g. IP_PKTINFO) sendmsg4 may see user_ip4 == 0. */
	if (ctx->user_ip4 == 0)
		return deny4(ctx, cgid, hook, GW_DENY_NO_ADDR);
	if (is_gate4(cfg, ctx->user_ip4, bpf_ntohs((__u16)ctx->user_port)))
		return 1;
	return deny4(ctx, cgid, hook, GW_DENY_NOT_GATE);
}

static __always_inline int check6(struct bpf_sock_addr *ctx, __u8 hook)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct gw_run_config *cfg = gw_runs.lookup(&cgid);
	__u32 ip6[4];

	ip6[0] = ctx->user_ip6[0];
	ip6[1] = ctx->user_ip6[1];
	ip6[2] = ctx->user_ip6[2];
	ip6[3] = ctx->user_ip6[3];
	if (!cfg)
		return deny6(ctx, cgid, hook, GW_DENY_NO_RUN, ip6);
	if (is_gate6(cfg, ip6, bpf_ntohs((__u16)ctx->user_port)))
		return 1;
	return deny6(ctx, cgid, hook, GW_DENY_NOT_GATE, ip6);
}

int gw_connect4(struct bpf_sock_addr *ctx)
{
	if (ctx->user_family != AF_INET)
		return 0;
	return check4(ctx, GW_HOOK_CONNECT4);
}

int gw_connect6(struct bpf_sock_addr *ctx)
{
	if (ctx->user_family != AF_INET6)
		return 0;
	return check6(ctx, GW_HOOK_CONNECT6);
}

/* Runs only for unconnected UDP; an AF_INET6 socket sending to ::ffff:a.b.c.d lands here. */
int gw_sendmsg4(struct bpf_sock_addr *ctx)
{
	if (ctx->user_family != AF_INET)
		return 0;
	return check4(ctx, GW_HOOK_SENDMSG4);
}

int gw_sendmsg6(struct bpf_sock_addr *ctx)
{
	if (ctx->user_family != AF_INET6)
		return 0;
	return check6(ctx, GW_HOOK_SENDMSG6);
}
