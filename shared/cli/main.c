/* main.c — the dspark command-line tool (subcommands are filled in by cmd_*.c). */
#include <stdio.h>
int main(void) { puts("dspark " DS_VERSION); return 0; }
