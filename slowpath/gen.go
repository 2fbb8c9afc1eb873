package slowpath

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -nostdinc" -target bpfel -type steer_key steer ../bpf/steer.c -- -I../bpf/include
//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -nostdinc" -target bpfel xsk ../bpf/xsk.c -- -I../bpf/include
