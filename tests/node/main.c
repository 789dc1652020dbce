/*
** main.c — test_node_core GROUP: runs one group of the node-core tests
** (cases.h); ctest registers each group as node.<group>.
*/
#include <stdio.h>
#include <string.h>

#include "cases.h"

int main(int argc, char **argv)
{
    static const struct { const char *name; int (*run)(void); } groups[] = {
        { "intake", node_intake_tests },   { "admission", node_admission_tests },
        { "deadline", node_deadline_tests }, { "quota", node_quota_tests },
        { "cascade", node_cascade_tests }, { "takeback", node_takeback_tests },
        { "center", node_center_tests },   { "prefix", node_prefix_tests },
        { "journal", node_journal_tests }, { "route", node_route_tests },
        { "answer", node_answer_tests },
    };
    for (size_t i = 0; argc == 2 && i < sizeof groups / sizeof groups[0]; i++)
        if (!strcmp(argv[1], groups[i].name)) return groups[i].run() ? 1 : 0;
    fprintf(stderr, "usage: %s intake|admission|deadline|quota|cascade|takeback|center|prefix|journal|route|answer\n", argv[0]);
    return 2;
}
