/*
** kern_neondot.c — the dot-product build of kern_neon.c ("neondot",
** ds_kern_neondot): the same source compiled with -march=armv8.2-a+dotprod,
** so its int8 dots use vdotq_s32. See kern_neon.c for the contract.
*/
#include "kern_neon.c"
