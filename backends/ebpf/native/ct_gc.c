/* The connection tracking GC's judgement and deletes (backends/ebpf/ct_gc.py's
 * expired_rows and remove_unchanged) in C: the same rule, no Python per entry. Built by
 * backends/ebpf/build.py into libsvcproxy_ct_gc.so and loaded with ctypes; when it is
 * missing ct_gc.py does the same work in Python. Layouts: struct ct_key (40 bytes) and
 * struct ct_val (56 bytes) of bpf/ct.h, as packet_layout.py's CT_KEY and CT_VAL. */
#include <linux/bpf.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KEY 40
#define VAL 56
#define FORWARD 0

static void other_key(const uint8_t *key, const uint8_t *val, uint8_t *out)
{
    memcpy(out, val + 16, 16);      /* saddr <- the rewrite's daddr */
    memcpy(out + 16, val, 16);      /* daddr <- its saddr */
    memcpy(out + 32, val + 34, 2);  /* sport <- its dport */
    memcpy(out + 34, val + 32, 2);  /* dport <- its sport */
    out[36] = key[36];              /* protocol, family */
    out[37] = key[37];
    out[38] = key[38] == 0 ? 1 : key[38] == 1 ? 0 : key[38];
    out[39] = 0;
}

/* Idle past its lifetime: last_ns below the limit (a limit of 0 or less: never). */
static int idle(uint64_t last, int64_t limit)
{
    return limit > 0 && last < (uint64_t)limit;
}

static uint64_t hash_key(const uint8_t *key)
{
    uint64_t h = 0x9E3779B97F4A7C15ull, w;
    for (int i = 0; i < KEY; i += 8) {
        memcpy(&w, key + i, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
    }
    return h;
}

static int64_t find(const int64_t *slots, uint64_t mask, const uint8_t *keys,
                    const uint8_t *key)
{
    for (uint64_t i = hash_key(key) & mask;; i = (i + 1) & mask) {
        if (slots[i] < 0 || memcmp(keys + slots[i] * KEY, key, KEY) == 0)
            return slots[i];
    }
}

/* Rows to remove among n entries (keys and values end to end), written to dead; the
 * number of live flows (forward entries) to *alive_flows. limit[proto << 8 | state]:
 * the last_ns below which an entry of that protocol and state is idle past its lifetime.
 * Returns how many rows, or -1 when memory is short. */
long svcproxy_ct_expired(const uint8_t *keys, const uint8_t *values, uint32_t n,
                         const int64_t *limit, uint32_t *dead, uint32_t *alive_flows)
{
    uint64_t cap = 1, mask, last;
    uint8_t other[KEY], *alive;
    int64_t *slots, j;
    long count = 0;
    uint32_t flows = 0;

    while (cap < 2 * (uint64_t)n + 2)
        cap <<= 1;
    mask = cap - 1;
    slots = malloc(cap * sizeof(*slots));
    alive = calloc(n ? n : 1, 1);
    if (!slots || !alive) {
        free(slots);
        free(alive);
        return -1;
    }
    memset(slots, 0xff, cap * sizeof(*slots));
    for (uint32_t r = 0; r < n; r++) {
        uint64_t i = hash_key(keys + (uint64_t)r * KEY) & mask;
        while (slots[i] >= 0)
            i = (i + 1) & mask;
        slots[i] = r;
    }
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *k = keys + (uint64_t)r * KEY, *v = values + (uint64_t)r * VAL;
        if (k[38] != FORWARD)
            continue;
        memcpy(&last, v + 48, 8);
        if (idle(last, limit[k[36] << 8 | v[37]]))
            dead[count++] = r;
        else
            alive[r] = 1, flows++;
    }
    for (uint32_t r = 0; r < n; r++) {
        const uint8_t *k = keys + (uint64_t)r * KEY, *v = values + (uint64_t)r * VAL;
        if (k[38] == FORWARD)
            continue;
        other_key(k, v, other);
        j = find(slots, mask, keys, other);
        if (j >= 0) {
            uint8_t back[KEY];
            other_key(keys + j * KEY, values + j * VAL, back);
            if (memcmp(back, k, KEY) == 0) {
                if (!alive[j])
                    dead[count++] = r;
                continue;
            }
        }
        memcpy(&last, v + 48, 8);
        if (idle(last, limit[k[36] << 8]))
            dead[count++] = r;
    }
    free(slots);
    free(alive);
    *alive_flows = flows;
    return count;
}

static long bpf_elem(int cmd, int fd, const void *key, void *value, uint64_t flags)
{
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.map_fd = fd;
    attr.key = (uint64_t)(uintptr_t)key;
    attr.value = (uint64_t)(uintptr_t)value;
    attr.flags = flags;
    return syscall(__NR_bpf, cmd, &attr, sizeof(attr));
}

/* Remove each entry of keys/values (end to end) named by rows (count of them; rows NULL:
 * the first count entries) that still holds that value: one atomic
 * BPF_MAP_LOOKUP_AND_DELETE_ELEM each; an entry a packet changed since is put back at once
 * (BPF_NOEXIST: unless the program wrote it again first). Returns how many were removed. */
long svcproxy_ct_remove_unchanged(int fd, const uint8_t *keys, const uint8_t *values,
                                  const uint32_t *rows, uint32_t count)
{
    uint8_t held[VAL];
    long removed = 0;

    for (uint32_t i = 0; i < count; i++) {
        uint64_t r = rows ? rows[i] : i;
        const uint8_t *k = keys + r * KEY, *v = values + r * VAL;
        if (bpf_elem(BPF_MAP_LOOKUP_AND_DELETE_ELEM, fd, k, held, 0) != 0)
            continue;
        if (memcmp(held, v, VAL) == 0)
            removed++;
        else
            bpf_elem(BPF_MAP_UPDATE_ELEM, fd, k, held, BPF_NOEXIST);
    }
    return removed;
}
