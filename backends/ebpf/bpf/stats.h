/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Counters of the tc (and XDP) packet path, per CPU (summed by packet_stats.py): what
 * a user needs to see when flows are refused for want of a resource.
 */
#ifndef SVCPROXY_STATS_H
#define SVCPROXY_STATS_H

#define STAT_NAT_EXHAUSTED 0 /* a new flow dropped: no NAT port free for it */
#define STAT_SCTP_CSUM 1     /* an SCTP packet whose CRC32c could not be computed again */
#define STATS_COUNT 2

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STATS_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} spp_stats SEC(".maps");

static __always_inline void stat_inc(__u32 index)
{
	__u64 *count = bpf_map_lookup_elem(&spp_stats, &index);

	if (count)
		*count += 1;
}

#endif
