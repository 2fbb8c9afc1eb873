package fastpath

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -nostdinc" -target bpfel -type flow_key -type flow_value -type flow_stats -type counter relay ../bpf/relay.c -- -I../bpf/include
//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -nostdinc" -target bpfel -type egress_errors -type redirmon_config -type probe_result redirmon ../bpf/redirmon.c -- -I../bpf/include
