/* Maglev table population (Eisenbud et al., NSDI 2016, Pseudocode 1), the loop of
 * backends/ebpf/maglev.py's _populate in C: the Python side computes each endpoint's
 * permutation (offset, skip) and their turn order; this fills the table. Built by
 * backends/ebpf/build.py into libsvcproxy_maglev.so and loaded with ctypes; when it is
 * missing the Python loop builds the same table. */
#include <stdint.h>
#include <stdlib.h>

/* Fill entry[0..size) with the endpoint index each slot names. The n endpoints take
 * turns in the given order: turn t claims the next free slot of its permutation,
 * starting at offset[t] and stepping by skip[t] (0 < skip < size), and writes
 * index[t] there; size // n full rounds, then the first size % n turns of one more.
 * Returns 0, or -1 when the scratch space cannot be allocated. */
int svcproxy_maglev_populate(uint32_t size, uint32_t n, const uint32_t *offset,
                             const uint32_t *skip, const uint16_t *index, uint16_t *entry)
{
    uint8_t *taken;
    uint32_t *cand;
    uint32_t filled = 0, t, c;

    if (n == 0)
        return 0;
    taken = calloc(size, 1);
    cand = malloc(sizeof(*cand) * n);
    if (!taken || !cand) {
        free(taken);
        free(cand);
        return -1;
    }
    for (t = 0; t < n; t++)
        cand[t] = offset[t];
    while (filled < size) {
        for (t = 0; t < n && filled < size; t++) {
            c = cand[t];
            while (taken[c]) {
                c += skip[t];
                if (c >= size)
                    c -= size;
            }
            taken[c] = 1;
            entry[c] = index[t];
            c += skip[t];
            cand[t] = c >= size ? c - size : c;
            filled++;
        }
    }
    free(taken);
    free(cand);
    return 0;
}
