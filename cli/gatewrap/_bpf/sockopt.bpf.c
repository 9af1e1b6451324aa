/* cgroup/setsockopt: refuse IPv4 options and IPv6 extension headers (hop-by-hop,
 * destination options, routing headers, and their RFC 2292 spellings). With them a socket
 * "connected to the gate" sends packets routed elsewhere (source routing, segment routing):
 * skb_egress would drop them, but a dropped TCP SYN makes connect() hang, so they are
 * refused here, loudly, at setsockopt(2) with EPERM. */

/* include/uapi/linux/in.h and in6.h */
#define GW_SOL_IP 0
#define GW_SOL_IPV6 41
#define GW_IP_OPTIONS 4

static __always_inline int ipv6_ext_header_opt(int optname)
{
	switch (optname) {
	case 3:  /* IPV6_2292HOPOPTS */
	case 4:  /* IPV6_2292DSTOPTS */
	case 5:  /* IPV6_2292RTHDR */
	case 6:  /* IPV6_2292PKTOPTIONS */
	case 54: /* IPV6_HOPOPTS */
	case 55: /* IPV6_RTHDRDSTOPTS */
	case 57: /* IPV6_RTHDR */
	case 59: /* IPV6_DSTOPTS */
		return 1;
	}
	return 0;
}

int gw_setsockopt(struct bpf_sockopt *ctx)
{
	int level = ctx->level, optname = ctx->optname;
	struct gw_event ev = {};
	__u64 cgid;

	if (!(level == GW_SOL_IP && optname == GW_IP_OPTIONS) &&
	    !(level == GW_SOL_IPV6 && ipv6_ext_header_opt(optname)))
		return 1;
	cgid = bpf_get_current_cgroup_id();
	fill_task(&ev, cgid);
	ev.family = level == GW_SOL_IP ? AF_INET : AF_INET6;
	ev.protocol = optname;
	ev.hook = GW_HOOK_SETSOCKOPT;
	ev.verdict = GW_DENY_IP_OPTIONS;
	return deny(&ev);
}
