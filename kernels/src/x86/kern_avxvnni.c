/*
** kern_avxvnni.c — the AVX-VNNI build of kern_avx2.c ("avxvnni",
** ds_kern_avxvnni): the same source compiled with -mavxvnni, so its int8
** and int16 multiply-accumulates are vpdpbusd and vpdpwssd on 256 bits. For
** x86-64 CPUs with AVX-VNNI and no AVX-512 VNNI. See kern_avx2.c.
*/
#define DS_KERN_AVXVNNI 1
#include "kern_avx2.c"
