/* cgroup_skb/egress: the packet-level backstop. It sees the real IP header, so it
 * catches what the sock_addr hooks cannot: IPv4 source-route options and IPv6 routing
 * headers aimed "at the gate", and packets of any socket that slipped past
 * sock_create. Only TCP/UDP to the gate's address and ports, without IPv4 options or
 * IPv6 extension headers, leave. It runs in softirq context for some packets, so the
 * run is found with bpf_skb_cgroup_id(), never the current task. A dropped TCP SYN
 * makes connect() hang until its timeout: the sock_addr hooks stay the loud first line. */

#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>

static __always_inline __u16 dst_port(struct __sk_buff *skb, __u32 l4_off)
{
	__u16 port = 0;

	bpf_skb_load_bytes(skb, l4_off + 2, &port, sizeof(port));
	return bpf_ntohs(port);
}

/* Why an IPv4 packet may not leave (a GW_DENY_*), or 0; fills ev's family, protocol,
 * destination and port as far as the packet was read. */
static __always_inline __u8 egress4(struct __sk_buff *skb, const struct gw_run_config *cfg,
				    struct gw_event *ev)
{
	struct iphdr ip = {};

	ev->family = AF_INET;
	if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
		return GW_DENY_NOT_GATE;
	ev->dst.v4 = ip.daddr;
	ev->protocol = ip.protocol;
	if (ip.ihl != 5)
		return GW_DENY_IP_OPTIONS;
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return GW_DENY_SOCK_KIND;
	ev->dst_port = dst_port(skb, sizeof(ip));
	if (is_gate4(cfg, ip.protocol == IPPROTO_UDP, ip.daddr, ev->dst_port))
		return 0;
	return GW_DENY_NOT_GATE;
}

static __always_inline __u8 egress6(struct __sk_buff *skb, const struct gw_run_config *cfg,
				    struct gw_event *ev)
{
	struct ipv6hdr ip6 = {};

	ev->family = AF_INET6;
	if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
		return GW_DENY_NOT_GATE;
	__builtin_memcpy(ev->dst.v6, &ip6.daddr, sizeof(ev->dst.v6));
	ev->protocol = ip6.nexthdr;
	/* Any extension header (routing header type 0/2/3 included) is refused. */
	if (ip6.nexthdr != IPPROTO_TCP && ip6.nexthdr != IPPROTO_UDP)
		return GW_DENY_IP_OPTIONS;
	ev->dst_port = dst_port(skb, sizeof(ip6));
	if (is_gate6(cfg, ip6.nexthdr == IPPROTO_UDP, ev->dst.v6, ev->dst_port))
		return 0;
	return GW_DENY_NOT_GATE;
}

/* One deny() call, as in sock_addr.bpf.c: each call inlines the whole recording path. */
int gw_skb_egress(struct __sk_buff *skb)
{
	__u64 cgid = bpf_skb_cgroup_id(skb);
	struct gw_run_config *cfg = gw_runs.lookup(&cgid);
	struct gw_event ev = {};
	__u8 verdict = GW_DENY_SOCK_KIND;

	if (!cfg)
		verdict = GW_DENY_NO_RUN;
	else if (skb->protocol == bpf_htons(ETH_P_IP))
		verdict = egress4(skb, cfg, &ev);
	else if (skb->protocol == bpf_htons(ETH_P_IPV6))
		verdict = egress6(skb, cfg, &ev);
	if (!verdict)
		return 1;
	ev.cgroup_id = cgid;
	ev.hook = GW_HOOK_SKB_EGRESS;
	ev.verdict = verdict;
	return deny(&ev);
}
