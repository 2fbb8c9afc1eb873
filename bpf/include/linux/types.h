/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/* Minimal stand-in for the kernel's linux/types.h, so bpf/ builds with
 * clang -target bpf and no system headers. */
#ifndef __LINUX_TYPES_H
#define __LINUX_TYPES_H

typedef signed char __s8;
typedef unsigned char __u8;
typedef signed short __s16;
typedef unsigned short __u16;
typedef signed int __s32;
typedef unsigned int __u32;
typedef signed long long __s64;
typedef unsigned long long __u64;

typedef __u16 __le16;
typedef __u16 __be16;
typedef __u32 __le32;
typedef __u32 __be32;
typedef __u64 __le64;
typedef __u64 __be64;
typedef __u16 __sum16;
typedef __u32 __wsum;

#define __aligned_u64 __u64 __attribute__((aligned(8)))

#endif
