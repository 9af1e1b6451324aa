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

static __always_inline int skb_drop(__u64 cgid, __u16 family, __u8 proto, __u8 verdict,
				    const __u32 *dst, int v6, __u16 port)
{
	struct gw_event ev = {};

	ev.cgroup_id = cgid;
	ev.family = family;
	ev.protocol = proto;
	ev.dst_port = port;
	ev.hook = GW_HOOK_SKB_EGRESS;
	ev.verdict = verdict;
	ev.dst.v6[0] = dst[0];
	if (v6) {
		ev.dst.v6[1] = dst[1];
		ev.dst.v6[2] = dst[2];
		ev.dst.v6[3] = dst[3];
	}
	return deny(&ev);
}

static __always_inline __u16 dst_port(struct __sk_buff *skb, __u32 l4_off)
{
	__u16 port = 0;

	bpf_skb_load_bytes(skb, l4_off + 2, &port, sizeof(port));
	return bpf_ntohs(port);
}

static __always_inline int egress4(struct __sk_buff *skb, __u64 cgid, const struct gw_run_config *cfg)
{
	struct iphdr ip = {};
	__u32 dst[4] = {};

	if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
		return skb_drop(cgid, AF_INET, 0, GW_DENY_NOT_GATE, dst, 0, 0);
	dst[0] = ip.daddr;
	if (ip.ihl != 5)
		return skb_drop(cgid, AF_INET, ip.protocol, GW_DENY_IP_OPTIONS, dst, 0, 0);
	if (ip.protocol != IPPROTO_TCP && ip.protocol != IPPROTO_UDP)
		return skb_drop(cgid, AF_INET, ip.protocol, GW_DENY_SOCK_KIND, dst, 0, 0);
	__u16 port = dst_port(skb, sizeof(ip));
	if (is_gate4(cfg, ip.protocol == IPPROTO_UDP, ip.daddr, port))
		return 1;
	return skb_drop(cgid, AF_INET, ip.protocol, GW_DENY_NOT_GATE, dst, 0, port);
}

static __always_inline int egress6(struct __sk_buff *skb, __u64 cgid, const struct gw_run_config *cfg)
{
	struct ipv6hdr ip6 = {};
	__u32 dst[4] = {};

	if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
		return skb_drop(cgid, AF_INET6, 0, GW_DENY_NOT_GATE, dst, 1, 0);
	__builtin_memcpy(dst, &ip6.daddr, sizeof(dst));
	/* Any extension header (routing header type 0/2/3 included) is refused. */
	if (ip6.nexthdr != IPPROTO_TCP && ip6.nexthdr != IPPROTO_UDP)
		return skb_drop(cgid, AF_INET6, ip6.nexthdr, GW_DENY_IP_OPTIONS, dst, 1, 0);
	__u16 port = dst_port(skb, sizeof(ip6));
	if (is_gate6(cfg, ip6.nexthdr == IPPROTO_UDP, dst, port))
		return 1;
	return skb_drop(cgid, AF_INET6, ip6.nexthdr, GW_DENY_NOT_GATE, dst, 1, port);
}

int gw_skb_egress(struct __sk_buff *skb)
{
	__u64 cgid = bpf_skb_cgroup_id(skb);
	struct gw_run_config *cfg = gw_runs.lookup(&cgid);
	__u32 none[4] = {};

	if (!cfg)
		return skb_drop(cgid, 0, 0, GW_DENY_NO_RUN, none, 0, 0);
	if (skb->protocol == bpf_htons(ETH_P_IP))
		return egress4(skb, cgid, cfg);
	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return egress6(skb, cgid, cfg);
	return skb_drop(cgid, 0, 0, GW_DENY_SOCK_KIND, none, 0, 0);
}
