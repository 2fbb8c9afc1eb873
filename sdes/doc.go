// Package sdes parses and generates SDP Security Descriptions (RFC 4568
// "a=crypto" attributes) for the SRTP suites relayd supports:
// AES_CM_128_HMAC_SHA1_80/_32 (RFC 4568), AES_256_CM_HMAC_SHA1_80/_32
// (RFC 6188) and AEAD_AES_128_GCM/AEAD_AES_256_GCM (RFC 7714).
//
// An attribute carries exactly one inline key (key||salt in base64, padded
// or not), an optional lifetime (decimal or 2^n packets) and an optional MKI
// (value:length). Attributes with several key-params (";"-separated) are
// refused with ErrMultipleKeys: relayd rekeys by a new offer/answer, and a
// one-key attribute keeps the SRTP context simple. Session parameters are
// kept verbatim; Crypto.Supported reports the ones relayd's SRTP data plane
// cannot honour (KDR other than 0, UNENCRYPTED_*, UNAUTHENTICATED_SRTP,
// FEC_KEY, unknown ones).
//
// Parsing never panics on any input; every error says which part of the
// attribute is wrong and wraps one of the sentinel errors below.
package sdes
