/* cgroup/sock_create: refuse every inet socket but TCP and UDP. Raw and ICMP ping
 * sockets, SCTP and UDP-Lite send without passing the sock_addr hooks (KERNEL-NOTES.md);
 * refusing their creation makes socket(2) fail with EPERM. This hook runs only for
 * AF_INET/AF_INET6: AF_PACKET, AF_VSOCK and AF_NETLINK are the jail's (seccomp). */

static __always_inline int tcp_or_udp(const struct bpf_sock *sk)
{
	return (sk->type == SOCK_STREAM && sk->protocol == IPPROTO_TCP) ||
	       (sk->type == SOCK_DGRAM && sk->protocol == IPPROTO_UDP);
}

int gw_sock_create(struct bpf_sock *sk)
{
	__u64 cgid = bpf_get_current_cgroup_id();
	struct gw_event ev = {};

	if (gw_runs.lookup(&cgid) && tcp_or_udp(sk))
		return 1;
	fill_task(&ev, cgid);
	ev.family = sk->family;
	ev.sock_type = sk->type;
	ev.protocol = sk->protocol;
	ev.hook = GW_HOOK_SOCK_CREATE;
	ev.verdict = GW_DENY_SOCK_KIND;
	return deny(&ev);
}
