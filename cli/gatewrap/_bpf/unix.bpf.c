/* cgroup/connect_unix and cgroup/sendmsg_unix (Linux 6.7+): every unix socket address the
 * agent connects or sends to is allowed and recorded. Which sockets exist is the jail's
 * mount namespace's to decide (host sockets are absent from its view); abstract names live
 * in the network namespace, which is the sandbox's own. */

/* The context of a sock_addr program is a struct bpf_sock_addr_kern (include/linux/filter.h;
 * uaddrlen since 6.7), whose uaddr is the kernel's copy of the caller's address. The
 * verifier gives a unix hook no field for the path (only the bpf_sock_addr_set_sun_path
 * kfunc, which bcc cannot call), so it is read with bpf_probe_read_kernel. */
struct gw_sock_addr_kern {
	void *sk;
	void *uaddr;                    /* struct sockaddr * */
	__u64 tmp_reg;
	void *t_ctx;
	__u32 uaddrlen;
};

/* sizeof(sa_family_t): sun_path follows it in struct sockaddr_un. */
#define GW_SUN_PATH_OFF 2

static __always_inline int unix_record(struct bpf_sock_addr *ctx, __u8 hook)
{
	struct gw_sock_addr_kern kern = {};
	struct gw_event ev = {};

	fill_task(&ev, bpf_get_current_cgroup_id());
	ev.family = ctx->user_family;
	ev.sock_type = ctx->type;
	ev.hook = hook;
	ev.verdict = GW_ALLOW_UNIX;
	if (bpf_probe_read_kernel(&kern, sizeof(kern), ctx) == 0 && kern.uaddr &&
	    kern.uaddrlen > GW_SUN_PATH_OFF) {
		/* 64-bit: from a __u32, clang passes the helper an unclamped zero-extended copy,
		 * which the verifier refuses as an unbounded size. */
		__u64 len = kern.uaddrlen - GW_SUN_PATH_OFF;

		const char *src = (const char *)kern.uaddr + GW_SUN_PATH_OFF;
		char first = 0;
		long n;

		if (len > GW_UNIX_PATH)
			len = GW_UNIX_PATH;
		bpf_probe_read_kernel(&first, 1, src);
		if (first) {
			/* A pathname ends at its first NUL (unix_mkname_bsd); callers often pass
			 * sizeof(struct sockaddr_un) with stack garbage after it. */
			n = bpf_probe_read_kernel_str(ev.dst.path, len, src);
			ev.path_len = n > 0 ? n - 1 : 0;
		} else {
			/* An abstract name is all of its length. Only the address's own bytes are
			 * read: the rest of the kernel's copy (a sockaddr_storage) is not the caller's. */
			bpf_probe_read_kernel(ev.dst.path, len, src);
			ev.path_len = len;
		}
	}
	record(&ev);
	return 1;
}

int gw_connect_unix(struct bpf_sock_addr *ctx)
{
	return unix_record(ctx, GW_HOOK_CONNECT_UNIX);
}

int gw_sendmsg_unix(struct bpf_sock_addr *ctx)
{
	return unix_record(ctx, GW_HOOK_SENDMSG_UNIX);
}
