"""The example's URLs: the admin (runs, read-only) and the notes app."""

from django.contrib import admin
from django.urls import path
from notes import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("conversations/<str:conversation_id>/messages", views.post_message),
]
