/* main.c — dspark-center (filled in by the center issue). */
#include <stdio.h>
int main(void) { puts("dspark-center " DS_VERSION); return 0; }
