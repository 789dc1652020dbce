/*
** cases.h — the groups of the node-core tests (tests/node/), one per ctest
** name node.<group>; main.c runs the one its argument names. Each returns
** cmocka's count of failed cases.
*/
#ifndef DS_TEST_NODE_CASES_H
#define DS_TEST_NODE_CASES_H

int node_intake_tests(void);      /* test_intake.c */
int node_admission_tests(void);   /* test_admission.c */
int node_deadline_tests(void);    /* test_deadline.c */
int node_quota_tests(void);       /* test_quota.c */
int node_cascade_tests(void);     /* test_cascade.c */
int node_takeback_tests(void);    /* test_takeback.c */
int node_center_tests(void);      /* test_center.c */
int node_prefix_tests(void);      /* test_prefix.c */
int node_journal_tests(void);     /* test_journal.c */
int node_route_tests(void);       /* test_route.c */
int node_answer_tests(void);      /* test_answer.c */

#endif
