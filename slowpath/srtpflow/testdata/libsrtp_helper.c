/*
 * libsrtp_helper: protect or unprotect packets with libsrtp2, for the
 * interoperability test of package srtpflow (interop_test.go builds it with
 * gcc ... -lsrtp2; it is not part of relayd).
 *
 * usage: libsrtp_helper protect|unprotect SUITE KEYSALT_HEX MKI_HEX|-
 * stdin: lines "rtp HEX" or "rtcp HEX"; stdout: one line per input, the
 * resulting packet in hex, or "ERR <srtp_err_status_t>".
 */
#include <srtp2/srtp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int unhex(const char *s, unsigned char *out, int max) {
    int n = 0;
    while (s[0] && s[1] && s[0] != '\n') {
        unsigned int b;
        if (n >= max || sscanf(s, "%2x", &b) != 1)
            return -1;
        out[n++] = (unsigned char)b;
        s += 2;
    }
    return n;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s protect|unprotect SUITE KEYSALT_HEX MKI_HEX|-\n", argv[0]);
        return 2;
    }
    int protect = strcmp(argv[1], "protect") == 0;
    const char *suite = argv[2];
    static unsigned char key[64], mki[128];
    int keylen = unhex(argv[3], key, sizeof key);
    int mkilen = strcmp(argv[4], "-") == 0 ? 0 : unhex(argv[4], mki, sizeof mki);
    if (keylen <= 0 || mkilen < 0) {
        fprintf(stderr, "bad key or MKI\n");
        return 2;
    }

    srtp_err_status_t st = srtp_init();
    if (st) {
        fprintf(stderr, "srtp_init: %d\n", st);
        return 1;
    }
    srtp_policy_t p;
    memset(&p, 0, sizeof p);
    if (!strcmp(suite, "AES_CM_128_HMAC_SHA1_80")) {
        srtp_crypto_policy_set_aes_cm_128_hmac_sha1_80(&p.rtp);
        srtp_crypto_policy_set_aes_cm_128_hmac_sha1_80(&p.rtcp);
    } else if (!strcmp(suite, "AES_CM_128_HMAC_SHA1_32")) {
        srtp_crypto_policy_set_aes_cm_128_hmac_sha1_32(&p.rtp);
        srtp_crypto_policy_set_aes_cm_128_hmac_sha1_80(&p.rtcp); /* RFC 4568: SRTCP keeps 80 */
    } else if (!strcmp(suite, "AES_256_CM_HMAC_SHA1_80")) {
        srtp_crypto_policy_set_aes_cm_256_hmac_sha1_80(&p.rtp);
        srtp_crypto_policy_set_aes_cm_256_hmac_sha1_80(&p.rtcp);
    } else if (!strcmp(suite, "AES_256_CM_HMAC_SHA1_32")) {
        srtp_crypto_policy_set_aes_cm_256_hmac_sha1_32(&p.rtp);
        srtp_crypto_policy_set_aes_cm_256_hmac_sha1_80(&p.rtcp);
    } else if (!strcmp(suite, "AEAD_AES_128_GCM")) {
        srtp_crypto_policy_set_aes_gcm_128_16_auth(&p.rtp);
        srtp_crypto_policy_set_aes_gcm_128_16_auth(&p.rtcp);
    } else if (!strcmp(suite, "AEAD_AES_256_GCM")) {
        srtp_crypto_policy_set_aes_gcm_256_16_auth(&p.rtp);
        srtp_crypto_policy_set_aes_gcm_256_16_auth(&p.rtcp);
    } else {
        fprintf(stderr, "unknown suite %s\n", suite);
        return 2;
    }
    p.ssrc.type = protect ? ssrc_any_outbound : ssrc_any_inbound;
    p.window_size = 128;
    srtp_master_key_t mk = {key, mki, (unsigned int)mkilen};
    srtp_master_key_t *mks[1] = {&mk};
    if (mkilen > 0) {
        p.keys = mks;
        p.num_master_keys = 1;
    } else {
        p.key = key;
    }
    srtp_t s;
    st = srtp_create(&s, &p);
    if (st) {
        fprintf(stderr, "srtp_create(%s): %d\n", suite, st);
        return 3; /* suite not supported by this build */
    }

    static char line[8192];
    static unsigned char buf[4096];
    while (fgets(line, sizeof line, stdin)) {
        int rtcp = strncmp(line, "rtcp ", 5) == 0;
        int n = unhex(line + (rtcp ? 5 : 4), buf, 2048);
        if (n < 0) {
            printf("ERR badhex\n");
            fflush(stdout);
            continue;
        }
        int use = mkilen > 0;
        if (protect)
            st = rtcp ? srtp_protect_rtcp_mki(s, buf, &n, use, 0) : srtp_protect_mki(s, buf, &n, use, 0);
        else
            st = rtcp ? srtp_unprotect_rtcp_mki(s, buf, &n, use) : srtp_unprotect_mki(s, buf, &n, use);
        if (st) {
            printf("ERR %d\n", st);
        } else {
            for (int i = 0; i < n; i++)
                printf("%02x", buf[i]);
            printf("\n");
        }
        fflush(stdout);
    }
    srtp_dealloc(s);
    srtp_shutdown();
    return 0;
}
