/* Fixed-base products and multi-exponentiations in eight AVX-512 IFMA lanes (design §4.9).
 *
 * Paillier's randomizer h^alpha mod m (m = p^2, q^2 or n^2) is a product of one table
 * entry per window of alpha (common/crypto/batch.py, FixedBase). This kernel forms eight
 * such products at once, one per 64-bit lane of a 512-bit register, each lane with its
 * own alpha and so its own entries, under one modulus; and the aggregation's
 * prod_i c_i^(w_i) for eight weight columns at once over the same bases (Pippenger's
 * method, each lane with its own buckets):
 *
 *   numbers are held in radix 2^52, n digits (52n >= bits + 2), lane-interleaved;
 *   the product is Montgomery's (R = 2^52n), "almost" reduced (results < 2m, which
 *   R > 4m keeps closed under products), with the operand-scanning loop of the
 *   IFMA instructions vpmadd52luq / vpmadd52huq and carries left lazy inside a
 *   product (a digit gathers at most 4n additions below 2^52: under 2^61 for n <= 80);
 *   the table holds each entry x as x R mod m, so a chain of products stays in
 *   Montgomery form and one last product by 1 leaves it.
 *
 * Plain C over caller-owned buffers (no Python headers), built as an optional extension
 * at install time and loaded with ctypes (common/crypto/ifma_lanes.py). The table
 * index of each lane is a window of a secret exponent, as in the portable table
 * look-up: neither hides its memory access pattern from an observer on the same core.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_DIGITS 80 /* 4160 bits */
#define MASK52 ((1ULL << 52) - 1)

/* r = a b R^-1 mod m, almost reduced; all digits of a and b below 2^52; r may alias a.
 * One pass over the digits per digit b_i, the low and high halves of a_j b_i and m_j y
 * fused (y is known from digit 0 before the pass), so that each accumulator digit is
 * loaded and stored once per pass. */
static void mont_mul(__m512i *r, const __m512i *a, const __m512i *b, const __m512i *m, __m512i k0, int n)
{
    __m512i acc[MAX_DIGITS + 1];
    const __m512i zero = _mm512_setzero_si512();
    const __m512i mask = _mm512_set1_epi64((long long)MASK52);
    for (int j = 0; j <= n; j++)
        acc[j] = zero;
    for (int i = 0; i < n; i++) {
        const __m512i bi = b[i];
        const __m512i low = _mm512_madd52lo_epu64(acc[0], a[0], bi);
        const __m512i y = _mm512_and_si512(_mm512_madd52lo_epu64(zero, low, k0), mask);
        /* digit 0 is now 0 mod 2^52: its top is carried into the new digit 0 */
        const __m512i carry = _mm512_srli_epi64(_mm512_madd52lo_epu64(low, m[0], y), 52);
        __m512i aj = a[0], mj = m[0];
        for (int j = 0; j < n - 1; j++) {
            const __m512i an = a[j + 1], mn = m[j + 1];
            __m512i t = _mm512_madd52lo_epu64(acc[j + 1], an, bi);
            t = _mm512_madd52lo_epu64(t, mn, y);
            t = _mm512_madd52hi_epu64(t, aj, bi);
            acc[j] = _mm512_madd52hi_epu64(t, mj, y);
            aj = an;
            mj = mn;
        }
        acc[n - 1] = _mm512_madd52hi_epu64(_mm512_madd52hi_epu64(acc[n], aj, bi), mj, y);
        acc[0] = _mm512_add_epi64(acc[0], carry);
    }
    __m512i c = zero;
    for (int j = 0; j < n; j++) {
        const __m512i t = _mm512_add_epi64(acc[j], c);
        r[j] = _mm512_and_si512(t, mask);
        c = _mm512_srli_epi64(t, 52);
    }
}

/* Radix 2^64 (little-endian words) to radix 2^52 digits, for `count` numbers. */
void ppre_to_radix52(const uint64_t *words, int n_words, uint64_t *digits, int n_digits, size_t count)
{
    for (size_t c = 0; c < count; c++) {
        const uint64_t *w = words + c * (size_t)n_words;
        uint64_t *d = digits + c * (size_t)n_digits;
        for (int k = 0; k < n_digits; k++) {
            const int bit = 52 * k, word = bit / 64, shift = bit % 64;
            uint64_t v = word < n_words ? w[word] >> shift : 0;
            if (shift > 12 && word + 1 < n_words)
                v |= w[word + 1] << (64 - shift);
            d[k] = v & MASK52;
        }
    }
}

/* The first `used` lanes of acc (Montgomery form) as plain numbers below 2m: mont(acc, 1),
 * lane l written as n_words little-endian words at out[l * n_words]. */
static void store_plain(uint64_t *out, size_t used, __m512i *acc, const __m512i *m, __m512i k0, int n, int n_words)
{
    __m512i one[MAX_DIGITS];
    uint64_t lanes[MAX_DIGITS][8];
    for (int k = 0; k < n; k++)
        one[k] = _mm512_setzero_si512();
    one[0] = _mm512_set1_epi64(1);
    mont_mul(acc, acc, one, m, k0, n);
    for (int k = 0; k < n; k++)
        _mm512_storeu_si512((void *)lanes[k], acc[k]);
    for (size_t l = 0; l < used; l++) {
        uint64_t *w = out + l * (size_t)n_words;
        for (int i = 0; i < n_words; i++)
            w[i] = 0;
        for (int k = 0; k < n; k++) {
            const int bit = 52 * k, word = bit / 64, shift = bit % 64;
            if (word < n_words)
                w[word] |= lanes[k][l] << shift;
            if (shift > 12 && word + 1 < n_words)
                w[word + 1] |= lanes[k][l] >> (64 - shift);
        }
    }
}

/* The table of `rows` fixed bases, eight rows at a time in the lanes: entry d of row r is
 * g_r^d in Montgomery form, built as entry[d] = entry[d - 1] g_r (entry 0 is R mod m).
 *
 *   bases    rows numbers of n digits: g_r R mod m
 *   one      R mod m in n digits
 *   table    out: rows * entries numbers of n digits, entry-major */
int ppre_fixed_base_table_mb8(const uint64_t *bases, int rows, int entries, int n, const uint64_t *modulus,
                              uint64_t k0, const uint64_t *one, uint64_t *table)
{
    if (n < 1 || n > MAX_DIGITS || rows < 1 || entries < 2)
        return -1;
    __m512i m[MAX_DIGITS], g[MAX_DIGITS], cur[MAX_DIGITS];
    uint64_t lanes[MAX_DIGITS][8];
    const __m512i vk0 = _mm512_set1_epi64((long long)k0);
    for (int k = 0; k < n; k++)
        m[k] = _mm512_set1_epi64((long long)modulus[k]);
    for (int r0 = 0; r0 < rows; r0 += 8) {
        const int used = rows - r0 < 8 ? rows - r0 : 8;
        for (int k = 0; k < n; k++) {
            for (int l = 0; l < 8; l++)
                lanes[k][l] = bases[(size_t)(r0 + (l < used ? l : 0)) * n + k];
            g[k] = _mm512_loadu_si512((const void *)lanes[k]);
            cur[k] = _mm512_set1_epi64((long long)one[k]);
        }
        for (int d = 0; d < entries; d++) {
            if (d > 0)
                mont_mul(cur, cur, g, m, vk0, n);
            for (int k = 0; k < n; k++)
                _mm512_storeu_si512((void *)lanes[k], cur[k]);
            for (int l = 0; l < used; l++)
                for (int k = 0; k < n; k++)
                    table[(((size_t)(r0 + l)) * entries + d) * n + k] = lanes[k][l];
        }
    }
    return 0;
}

/* Window `row` (of `window` bits) of a little-endian exponent of `n_bytes` bytes. */
static uint32_t window_of(const uint8_t *e, int n_bytes, int row, int window)
{
    const int bit = row * window, byte = bit / 8;
    uint32_t v = 0;
    for (int i = 0; i < 4 && byte + i < n_bytes; i++)
        v |= (uint32_t)e[byte + i] << (8 * i);
    return (v >> (bit % 8)) & ((1u << window) - 1);
}

/* base^e mod m for `count` exponents, eight at a time: lane l's product of the table
 * entries its exponent's windows select, reduced out of Montgomery form, written as
 * n_words little-endian 64-bit words at out[i * n_words] (a value below 2m: the caller
 * reduces it).
 *
 *   table     rows * 2^window numbers of n digits (ppre_fixed_base_table_mb8)
 *   modulus   m in n digits; k0 = -m^-1 mod 2^52
 *   exponents count little-endian numbers of exp_bytes bytes, each below 2^(rows*window)
 * Returns 0, or -1 for a size this kernel does not take. */
int ppre_fixed_base_mb8(const uint64_t *table, int rows, int window, int n, const uint64_t *modulus,
                        uint64_t k0, const uint8_t *exponents, int exp_bytes, size_t count,
                        uint64_t *out, int n_words)
{
    if (n < 1 || n > MAX_DIGITS || rows < 1 || window < 1 || window > 16 || 64 * n_words < 52 * n - 52)
        return -1;
    const size_t entries = (size_t)1 << window;
    __m512i m[MAX_DIGITS], acc[MAX_DIGITS], entry[MAX_DIGITS];
    for (int k = 0; k < n; k++)
        m[k] = _mm512_set1_epi64((long long)modulus[k]);
    const __m512i vk0 = _mm512_set1_epi64((long long)k0);
    for (size_t first = 0; first < count; first += 8) {
        const size_t used = count - first < 8 ? count - first : 8;
        for (int row = 0; row < rows; row++) {
            long long offs[8];
            for (size_t l = 0; l < 8; l++) {
                /* a lane past the last exponent takes entry 0 (the 1) of every row */
                const uint32_t d = l < used ? window_of(exponents + (first + l) * (size_t)exp_bytes, exp_bytes, row, window) : 0;
                offs[l] = (long long)(((size_t)row * entries + d) * (size_t)n);
            }
            const __m512i base = _mm512_loadu_si512((const void *)offs);
            __m512i *dst = row == 0 ? acc : entry;
            for (int k = 0; k < n; k++)
                dst[k] = _mm512_i64gather_epi64(_mm512_add_epi64(base, _mm512_set1_epi64(k)),
                                                (const long long *)table, 8);
            if (row > 0)
                mont_mul(acc, acc, entry, m, vk0, n);
        }
        store_plain(out + first * (size_t)n_words, used, acc, m, vk0, n, n_words);
    }
    return 0;
}

/* `count` numbers (n_words little-endian words each, below m) in Montgomery form,
 * x R mod m = mont(x, R^2), eight at a time in the lanes: n digits each into mont. */
int ppre_to_montgomery_mb8(const uint64_t *values, size_t count, int n_words, int n, const uint64_t *modulus,
                           uint64_t k0, const uint64_t *r2, uint64_t *mont)
{
    if (n < 1 || n > MAX_DIGITS)
        return -1;
    __m512i m[MAX_DIGITS], vr2[MAX_DIGITS], x[MAX_DIGITS];
    uint64_t lanes[MAX_DIGITS][8];
    const __m512i vk0 = _mm512_set1_epi64((long long)k0);
    for (int k = 0; k < n; k++) {
        m[k] = _mm512_set1_epi64((long long)modulus[k]);
        vr2[k] = _mm512_set1_epi64((long long)r2[k]);
    }
    for (size_t first = 0; first < count; first += 8) {
        const size_t used = count - first < 8 ? count - first : 8;
        for (size_t l = 0; l < 8; l++) {
            uint64_t d[MAX_DIGITS];
            ppre_to_radix52(values + (first + (l < used ? l : 0)) * (size_t)n_words, n_words, d, n, 1);
            for (int k = 0; k < n; k++)
                lanes[k][l] = d[k];
        }
        for (int k = 0; k < n; k++)
            x[k] = _mm512_loadu_si512((const void *)lanes[k]);
        mont_mul(x, x, vr2, m, vk0, n);
        for (int k = 0; k < n; k++)
            _mm512_storeu_si512((void *)lanes[k], x[k]);
        for (size_t l = 0; l < used; l++)
            for (int k = 0; k < n; k++)
                mont[(first + l) * (size_t)n + k] = lanes[k][l];
    }
    return 0;
}

/* Eight multi-exponentiations over the same bases, one per lane: lane l computes
 * prod_i base_i^(exps[i * 8 + l]) mod m by Pippenger's bucket method with windows of
 * `window` bits over exponents below 2^exp_bits (at most 64), each lane gathering and
 * scattering its own buckets.
 *
 *   mont     count bases in Montgomery form, n digits each (ppre_to_montgomery_mb8)
 *   modulus  m in n digits; k0 = -m^-1 mod 2^52; one = R mod m in n digits
 *   buckets  scratch of 2^window * n * 8 words
 *   out      8 results of n_words words (below 2m: the caller reduces)
 * Returns 0, or -1 for a size this kernel does not take. */
int ppre_multi_exp_mb8(const uint64_t *mont, size_t count, int n_words, const uint64_t *exps, int exp_bits,
                       int window, int n, const uint64_t *modulus, uint64_t k0, const uint64_t *one,
                       uint64_t *buckets, uint64_t *out)
{
    if (n < 1 || n > MAX_DIGITS || window < 1 || window > 16 || exp_bits < 1 || exp_bits > 64 || 64 * n_words < 52 * n - 52)
        return -1;
    __m512i m[MAX_DIGITS], vone[MAX_DIGITS], acc[MAX_DIGITS], run[MAX_DIGITS], sum[MAX_DIGITS];
    __m512i base[MAX_DIGITS], tmp[MAX_DIGITS];
    const __m512i vk0 = _mm512_set1_epi64((long long)k0);
    for (int k = 0; k < n; k++) {
        m[k] = _mm512_set1_epi64((long long)modulus[k]);
        vone[k] = _mm512_set1_epi64((long long)one[k]);
        acc[k] = vone[k];
    }
    const size_t entries = (size_t)1 << window;
    const uint64_t mask = entries - 1;
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    __m512i *vb = (__m512i *)buckets; /* bucket d, digit k: vb[d * n + k], lane-interleaved */
    const int windows = (exp_bits + window - 1) / window;
    for (int t = windows - 1; t >= 0; t--) {
        if (t != windows - 1)
            for (int s = 0; s < window; s++)
                mont_mul(acc, acc, acc, m, vk0, n);
        for (size_t d = 0; d < entries; d++)
            for (int k = 0; k < n; k++)
                _mm512_storeu_si512((void *)(vb + d * n + k), vone[k]);
        for (size_t i = 0; i < count; i++) {
            long long offs[8];
            int any = 0;
            for (int l = 0; l < 8; l++) {
                const uint64_t d = (exps[i * 8 + l] >> (t * window)) & mask;
                any |= d != 0;
                offs[l] = (long long)(d * (size_t)n * 8); /* d = 0 goes to bucket 0, never read */
            }
            if (!any)
                continue;
            for (int k = 0; k < n; k++) /* the base, broadcast to every lane */
                base[k] = _mm512_set1_epi64((long long)mont[i * (size_t)n + k]);
            const __m512i vo = _mm512_add_epi64(_mm512_loadu_si512((const void *)offs), lane);
            for (int k = 0; k < n; k++)
                tmp[k] = _mm512_i64gather_epi64(_mm512_add_epi64(vo, _mm512_set1_epi64(8 * k)),
                                                (const long long *)buckets, 8);
            mont_mul(tmp, tmp, base, m, vk0, n);
            for (int k = 0; k < n; k++)
                _mm512_i64scatter_epi64((long long *)buckets, _mm512_add_epi64(vo, _mm512_set1_epi64(8 * k)), tmp[k], 8);
        }
        for (int k = 0; k < n; k++) {
            run[k] = vone[k];
            sum[k] = vone[k];
        }
        for (size_t dd = entries - 1; dd >= 1; dd--) {
            for (int k = 0; k < n; k++)
                tmp[k] = _mm512_loadu_si512((const void *)(vb + dd * n + k));
            mont_mul(run, run, tmp, m, vk0, n);
            mont_mul(sum, sum, run, m, vk0, n);
        }
        mont_mul(acc, acc, sum, m, vk0, n);
    }
    store_plain(out, 8, acc, m, vk0, n, n_words);
    return 0;
}
