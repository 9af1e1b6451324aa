/* cgroup sock_addr hooks: connect4/6 and sendmsg4/6 (unconnected UDP). Every attempt
 * not addressed to one of the gate's listeners gets EPERM and an event. */
/* Fill the fields every sock_addr hook may read; the caller sets ev->dst, since
 * the verifier rejects user_ip6 reads in v4 hooks and user_ip4 reads in v6 hooks. */
static __always_inline void fill_event(struct gw_event *ev, struct bpf_sock_addr *ctx,
				       __u64 cgid, __u8 hook, __u8 verdict)
{
	fill_task(ev, cgid);
	ev->family = ctx->user_family;
	ev->dst_port = bpf_ntohs((__u16)ctx->user_port);
	ev->sock_type = ctx->type;
	ev->protocol = ctx->protocol;
	ev->hook = hook;
	ev->verdict = verdict;
}

/* The verdict on a v4 hook's destination: 0 for one of the gate's listeners, else why not. */
static __always_inline __u8 verdict4(struct bpf_sock_addr *ctx, const struct gw_run_config *cfg)
{
	/* A destination of another family (AF_UNSPEC, say) is refused, and recorded. */
	if (ctx->user_family != AF_INET)
		return GW_DENY_FAMILY;
	if (!cfg)
		return GW_DENY_NO_RUN;
	/* With a control message (e.g. IP_PKTINFO) sendmsg4 may see user_ip4 == 0. */
	if (ctx->user_ip4 == 0)
		return GW_DENY_NO_ADDR;
	if (is_gate4(cfg, ctx->type == SOCK_DGRAM, ctx->user_ip4, bpf_ntohs((__u16)ctx->user_port)))
		return 0;
	return GW_DENY_NOT_GATE;
}

static __always_inline __u8 verdict6(struct bpf_sock_addr *ctx, const struct gw_run_config *cfg,
				     const __u32 *ip6)
{
	if (ctx->user_family != AF_INET6)
		return GW_DENY_FAMILY;
	if (!cfg)
		return GW_DENY_NO_RUN;
	if (is_gate6(cfg, ctx->type == SOCK_DGRAM, ip6, bpf_ntohs((__u16)ctx->user_port)))
		return 0;
	return GW_DENY_NOT_GATE;
}

/* Each hook calls deny() from one place only: every call is inlined with the whole recording
 * path (~500 instructions), which clang then optimises once per call (the cold start's compile). */
static __always_inline int check4(struct bpf_sock_addr *ctx, __u8 hook)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct gw_run_config *cfg = gw_runs.lookup(&cgid);
	__u8 verdict = verdict4(ctx, cfg);
	struct gw_event ev = {};

	if (!verdict)
		return 1;
	fill_event(&ev, ctx, cgid, hook, verdict);
	/* Whatever the family: udp_sendmsg sends to an AF_UNSPEC address as to an AF_INET one,
	 * so user_ip4 is where the datagram would have gone. */
	ev.dst.v4 = ctx->user_ip4;
	return deny(&ev);
}

static __always_inline int check6(struct bpf_sock_addr *ctx, __u8 hook)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct gw_run_config *cfg = gw_runs.lookup(&cgid);
	struct gw_event ev = {};
	__u32 ip6[4];
	__u8 verdict;

	ip6[0] = ctx->user_ip6[0];
	ip6[1] = ctx->user_ip6[1];
	ip6[2] = ctx->user_ip6[2];
	ip6[3] = ctx->user_ip6[3];
	verdict = verdict6(ctx, cfg, ip6);
	if (!verdict)
		return 1;
	fill_event(&ev, ctx, cgid, hook, verdict);
	if (verdict != GW_DENY_FAMILY) {
		ev.dst.v6[0] = ip6[0];
		ev.dst.v6[1] = ip6[1];
		ev.dst.v6[2] = ip6[2];
		ev.dst.v6[3] = ip6[3];
	}
	return deny(&ev);
}

int gw_connect4(struct bpf_sock_addr *ctx)
{
	return check4(ctx, GW_HOOK_CONNECT4);
}

int gw_connect6(struct bpf_sock_addr *ctx)
{
	return check6(ctx, GW_HOOK_CONNECT6);
}

/* Runs only for unconnected UDP; an AF_INET6 socket sending to ::ffff:a.b.c.d lands here. */
int gw_sendmsg4(struct bpf_sock_addr *ctx)
{
	return check4(ctx, GW_HOOK_SENDMSG4);
}

int gw_sendmsg6(struct bpf_sock_addr *ctx)
{
	return check6(ctx, GW_HOOK_SENDMSG6);
}
