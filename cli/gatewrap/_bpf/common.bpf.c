/* Maps and helpers shared by every gatewrap hook. The loader compiles the program
 * files as one text with this file first: bcc rewrites map calls (gw_runs.lookup())
 * only in its main text, not in included headers. */
#include <uapi/linux/bpf.h>
#include <uapi/linux/in.h>
#include <uapi/linux/in6.h>
#include <linux/socket.h>
#include <linux/net.h>
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

/* Put the event on the run's ring buffer (or count it lost) and refuse: the syscall gets EPERM. */
static __always_inline int deny(struct gw_event *ev)
{
	__u64 cgid = ev->cgroup_id;
	void *rb = gw_events.lookup(&cgid);

	if (!rb || bpf_ringbuf_output(rb, ev, sizeof(*ev), 0) != 0)
		count_lost(cgid);
	return 0;
}
