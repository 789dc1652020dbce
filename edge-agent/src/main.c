/* main.c — dspark-edge (filled in by the edge issue). */
#include <stdio.h>
int main(void) { puts("dspark-edge " DS_VERSION); return 0; }
